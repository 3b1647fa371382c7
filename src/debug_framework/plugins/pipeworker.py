"""A worker process connected by two pipes, shared by the plugin sweep (:mod:`.sweep`) and the
operator-conformance sweep (:mod:`debug_framework.conformance.sweep`).

The parent runs ``python -m MODULE READ_FD WRITE_FD`` (a plain subprocess, not ``multiprocessing``'s
spawn, so the caller's main module is never re-imported), sends the start arguments, then requests;
the child answers each with ``("ok", value)`` or ``("error", message)`` (:func:`serve`).

    worker = PipeWorker("debug_framework.plugins.worker", args)
    reply = worker.ask(("run", "rms_norm", 0), timeout=60.0)  # None: it died or hung (then stopped)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

__all__ = ["PipeWorker", "serve", "Handler"]


class PipeWorker:
    """One worker process and its two pipes; the caller restarts it after a crash or a hang.

    ``env`` is added to the caller's environment (with ``PYTHONPATH`` set to the caller's
    ``sys.path``), ``cwd`` is the worker's working directory, ``quiet`` discards its stderr."""

    def __init__(self, module: str, args: tuple[Any, ...], *, env: dict[str, str] | None = None,
                 cwd: str | None = None, quiet: bool = False) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if quiet else None, cwd=cwd)
        os.close(to_child_r)
        os.close(from_child_w)
        self.out = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        #: the last request ran past its timeout (the worker was killed): a hang, not a crash
        self.killed = False
        self.out.send(args)

    def _reply(self, timeout: float) -> tuple[str, Any] | None:
        """The next reply; ``("died", None)`` when the worker closed its pipe, None on timeout."""
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
        except (EOFError, OSError):
            return ("died", None)
        return None

    def wait_dying(self) -> None:
        """Let a worker that closed its pipe finish dying (up to 30 s), to read its exit status."""
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass

    def ask(self, msg: tuple[Any, ...], timeout: float) -> tuple[str, Any] | None:
        """The reply, or None when the worker died or ran past ``timeout`` (it is then stopped)."""
        try:
            self.out.send(msg)
        except (BrokenPipeError, OSError):
            return None
        reply = self._reply(timeout)
        if reply is None or reply[0] == "died":
            self.killed = reply is None  # a timeout: the worker is killed (a hang)
            if not self.killed:
                self.wait_dying()
            self.stop()
            return None
        return reply

    def stop(self) -> None:
        """Ask the worker to stop (2 s), else kill it; close the pipes."""
        if self.proc.poll() is None:
            try:
                self.out.send(("stop",))
                self.proc.wait(2)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.conn.close()
        self.out.close()


class Handler(Protocol):
    """A worker's state: answers one request."""

    def handle(self, msg: tuple[Any, ...]) -> Any: ...


def serve(inbox: Any, conn: Any, start: Callable[..., Handler]) -> None:
    """The worker's loop: read the start arguments from ``inbox`` and make the state with ``start``
    (its failure is reported as ``("error", message)``; the parent raises it as a DF error), answer
    ``("ok", "ready")``, then answer each request on ``conn`` until ``("stop",)`` or the pipe closes."""
    try:
        state = start(*inbox.recv())
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it as a DF error
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", "ready"))
    while True:
        try:
            msg = inbox.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        try:
            conn.send(("ok", state.handle(msg)))
        except Exception as exc:  # noqa: BLE001 - an error of ours is reported, not a verdict
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
