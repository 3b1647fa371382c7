"""User backends for the resource tests (time limits, killed owners, killed batch executors).

Importable from subprocess scripts (put this directory on ``sys.path``). Each backend runs eager
PyTorch for the real checkpoints, then behaves as told:

* ``hang``: never returns (a Python loop, so an interruption can reach it; gives up after 60 s);
* ``hang_second``: the first run returns, the second (the noise-floor stage) hangs;
* ``slow:<seconds>``: takes that long, holding an exclusive lock named after the model path: a
  second process running the same model at the same time writes ``OVERLAP`` into the marker folder;
* ``exit_once``: the first run anywhere (the one creating ``EXITED`` in the marker folder) kills its
  process (``os._exit``), as a lost worker; every run appends its model path to ``RUNS``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path

from debug_framework.backends import get_backend, register_backend, user_backend

_GIVE_UP_S = 60.0


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


class BehavingRunner:
    def __init__(self, model, dtype, device, mode: str, markers: str | None) -> None:
        self.inner = get_backend("pytorch")
        self.inner.prepare(model, dtype, device)
        self.mode, self.markers, self.calls = mode, markers, 0
        self.model_path = str(model.path)

    def run(self, inputs, keys):
        self.calls += 1
        out = self.inner.run(inputs, keys).tensors
        if self.mode == "hang" or (self.mode == "hang_second" and self.calls >= 2):
            _spin(_GIVE_UP_S)
            raise RuntimeError("the hanging backend was never interrupted")
        if self.mode == "exit_once":
            self._exit_once()
        if self.mode.startswith("slow:"):
            self._exclusive(float(self.mode.partition(":")[2]))
        return out

    def _exit_once(self) -> None:
        folder = Path(self.markers or ".")
        try:
            os.close(os.open(folder / "EXITED", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            with open(folder / "RUNS", "a") as out:
                out.write(f"{self.model_path}\n")
            return
        os._exit(3)

    def _exclusive(self, seconds: float) -> None:
        folder = Path(self.markers or ".")
        name = hashlib.sha1(self.model_path.encode()).hexdigest()[:16]
        with open(folder / f"{name}.lock", "a+") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with open(folder / "OVERLAP", "a") as out:
                    out.write(f"{self.model_path} {os.getpid()}\n")
            _spin(seconds)


def register(name: str, mode: str, markers: str | None = None) -> str:
    """Register backend ``name`` behaving as ``mode`` (replacing one of that name)."""
    register_backend(name, user_backend(name, lambda m, d, dev: BehavingRunner(m, d, dev, mode, markers),
                                        dtypes=("float32",)), replace=True)
    return name
