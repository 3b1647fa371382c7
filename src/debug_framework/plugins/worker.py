"""The op sweep's worker: the one lifecycle of the process that runs samples, for both subjects of
an op sweep, a kernel plugin (:mod:`.sweep`, ``debug_compile --sweep``) and a whole backend or
runtime (:mod:`debug_framework.conformance.sweep`, ``debug_opsweep``).

A sample that kills the worker (a segfault, an abort) or runs past its timeout costs that sample
alone: the parent records it (:meth:`SweepWorker.death`: ``crash`` with the signal, or ``hang``),
drops the worker, and the next request starts a fresh one (:class:`Lane`), which makes the
subject's samples again from their seed and resumes after the last recorded sample.

The parent runs ``python -m debug_framework.plugins.worker READ_FD WRITE_FD`` (a plain
subprocess, not ``multiprocessing``'s spawn, so the caller's main module is never re-imported),
sends ``(subject, start arguments)``, then requests; the child makes the subject's state
(:data:`SUBJECTS`: ``plugin`` -> :class:`~.subject.PluginSubject`, ``backend`` ->
:class:`~debug_framework.conformance.subject.BackendSubject`), answers ``("ok", "ready")`` and then
each request with ``("ok", value)`` or ``("error", message)`` (:func:`serve`).

    lane = Lane(lambda: SweepWorker("plugin", args, what="the kernel").started(300.0))
    reply = lane.ask(("run", "rms_norm", 0), timeout=60.0)  # None: it died or hung
    if reply is None:
        result = lane.died(60.0)                            # {"status": "crash", "reason": ...}
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import NotRequired, Protocol, TypedDict

__all__ = ["SUBJECTS", "Subject", "Request", "Reply", "WorkerDeath", "SweepWorker", "InProcess", "Lane", "serve",
           "make_subject", "signal_name"]

#: A request to the worker: its name first (``"run"``, ``"samples"``, ``"repro"``...), then its arguments.
Request = tuple[object, ...]
#: The worker's answer: ``("ok", value)`` or ``("error", message)``.
Reply = tuple[str, object]

#: The subjects a worker serves: name -> (module, class) of the state made from the start arguments.
SUBJECTS: dict[str, tuple[str, str]] = {
    "plugin": ("debug_framework.plugins.subject", "PluginSubject"),
    "backend": ("debug_framework.conformance.subject", "BackendSubject"),
}


class Subject(Protocol):
    """A worker's state: answers one request; released when the worker stops."""

    def handle(self, msg: Request) -> object:
        """The value of one request (an exception is reported as ``("error", message)``)."""
        ...

    def close(self) -> None:
        """Release what the state holds (scratch directories, settings it changed)."""
        ...


class WorkerDeath(TypedDict):
    """What happened to a worker that did not answer, as a sample's result records it."""

    status: str  # crash | hang
    reason: str
    signal: NotRequired[str]  # the signal's name, where one ended it


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11 ...; ``signal 99`` for a number without a name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def make_subject(kind: str, args: tuple[object, ...]) -> Subject:
    """The state of subject ``kind`` (:data:`SUBJECTS`) made from its start arguments."""
    module, name = SUBJECTS[kind]
    cls: Callable[..., Subject] = getattr(importlib.import_module(module), name)
    return cls(*args)


class SweepWorker:
    """One worker process and its two pipes; the caller replaces it after a crash or a hang.

    ``env`` is added to the caller's environment (with ``PYTHONPATH`` set to the caller's
    ``sys.path``), ``cwd`` is the worker's working directory, ``quiet`` discards its stderr;
    ``what`` names what crashes it in :meth:`death` (``the kernel``, ``the sample``)."""

    def __init__(self, subject: str, args: tuple[object, ...], *, env: dict[str, str] | None = None,
                 cwd: str | None = None, quiet: bool = False, what: str = "the sample") -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if quiet else None, cwd=cwd)
        os.close(to_child_r)
        os.close(from_child_w)
        self.out = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.what = what
        #: the last request ran past its timeout (the worker was killed): a hang, not a crash
        self.killed = False
        self.out.send((subject, args))

    def _reply(self, timeout: float) -> Reply | None:
        """The next reply; ``("died", None)`` when the worker closed its pipe, None on timeout."""
        try:
            if self.conn.poll(timeout):
                reply: Reply = self.conn.recv()
                return reply
        except (EOFError, OSError):
            return ("died", None)
        return None

    def started(self, timeout: float) -> Reply | None:
        """The worker's first answer (``("ok", "ready")``, or ``("error", why)`` where its state
        could not be made); None where it died or said nothing within ``timeout`` (see :meth:`death`)."""
        reply = self._reply(timeout)
        if reply is not None and reply[0] == "died":
            self.wait_dying()
            return None
        return reply

    def wait_dying(self) -> None:
        """Let a worker that closed its pipe finish dying (up to 30 s), to read its exit status."""
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass

    def ask(self, msg: Request, timeout: float) -> Reply | None:
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

    def death(self, timeout: float) -> WorkerDeath:
        """What happened to a worker that did not answer: a crash (its signal or exit status) or a
        hang (no answer within ``timeout``: killed)."""
        code = self.proc.poll()
        if code is None or self.killed:
            return {"status": "hang", "reason": f"no answer within {timeout:g} s (the worker was killed with SIGKILL)",
                    "signal": "SIGKILL"}
        if code < 0:
            name = signal_name(-code)
            how = name if name.startswith("signal ") else f"{name}, signal {-code}"
            return {"status": "crash", "reason": f"{self.what} crashed the worker process ({how})", "signal": name}
        return {"status": "crash", "reason": f"{self.what} crashed the worker process (exit status {code})"}

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


class InProcess:
    """A subject's state run inside the caller's process: no isolation from crashes and no
    timeout, for tests and for debugging a backend under a debugger. Answers as a worker does."""

    def __init__(self, subject: str, args: tuple[object, ...]) -> None:
        self.state = make_subject(subject, args)

    def ask(self, msg: Request, timeout: float) -> Reply | None:
        """The state's answer to ``msg`` (``timeout`` is not enforced)."""
        try:
            return ("ok", self.state.handle(msg))
        except Exception as exc:  # noqa: BLE001 - as the worker process reports it
            return ("error", f"{type(exc).__name__}: {exc}")

    def death(self, timeout: float) -> WorkerDeath:
        """Never called: an in-process state has no worker to die."""
        raise AssertionError("an in-process sweep has no worker to die")

    def stop(self) -> None:
        """Release the state."""
        self.state.close()


class Lane:
    """One worker at a time for one driver: started on first use by ``start``, dropped when it
    dies (:meth:`died`), started afresh by the next request."""

    def __init__(self, start: Callable[[], SweepWorker | InProcess]) -> None:
        self.start = start
        self.proc: SweepWorker | InProcess | None = None
        #: workers lost to a crash or a hang (each replaced when work remains)
        self.restarts = 0

    def worker(self) -> SweepWorker | InProcess:
        """The running worker, started now where there is none."""
        if self.proc is None:
            self.proc = self.start()
        return self.proc

    def ask(self, msg: Request, timeout: float) -> Reply | None:
        """The worker's reply; None when it died or hung (then call :meth:`died`). An exception of
        the sweep's own code in the worker comes back as ``("error", message)``."""
        return self.worker().ask(msg, timeout)

    def died(self, timeout: float) -> WorkerDeath:
        """What ended the worker that did not answer within ``timeout``; the lane drops it."""
        assert self.proc is not None
        result = self.proc.death(timeout)
        self.proc = None
        self.restarts += 1
        return result

    def close(self) -> None:
        """Stop the running worker, if any."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


def serve(inbox: Connection, conn: Connection) -> None:
    """The worker's loop: read ``(subject, start arguments)`` from ``inbox`` and make the state
    (:func:`make_subject`; its failure is reported as ``("error", message)``, which the parent
    raises as a DF error), answer ``("ok", "ready")``, then answer each request on ``conn`` until
    ``("stop",)`` or the pipe closes."""
    try:
        kind, args = inbox.recv()
        state = make_subject(kind, tuple(args))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it as a DF error
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", "ready"))
    try:
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
    finally:
        state.close()


def _die_with_parent(parent_pid: int) -> None:
    """End this worker when the sweep that started it is gone, even while a sample runs (an
    interrupted sweep leaves no worker compiling on its own): a daemon thread polls the parent's pid."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.25)
        os._exit(70)

    threading.Thread(target=watch, name="opsweep-parent-watch", daemon=True).start()


if __name__ == "__main__":
    _die_with_parent(os.getppid())
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
