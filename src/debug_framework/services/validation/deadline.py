"""The time limit of one validation (``config["max_session_duration"]``).

The engine opens :func:`session_deadline` around its loop over the stages and calls
:func:`check_deadline` at every stage boundary. A backend call made through
:func:`~.stages.call_backend` runs under :func:`bounded`: when the limit passes while the backend
is still working, a watchdog thread raises an exception *in the calling thread*
(``PyThreadState_SetAsyncExc``), which Python delivers at the next bytecode the backend executes.
That bounds every backend whose work returns to Python now and then (NumPy or PyTorch eager code,
Python loops, a polling wait); a single C call that never returns (a deadlocked driver) cannot be
interrupted inside the process, and the limit then applies at the next stage boundary.

Either way the session ends as ``error`` with "exceeded max_session_duration (N s)" (DF007) and
keeps the rows written before.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from ...errors import ResourceExhaustedError

__all__ = ["session_deadline", "check_deadline", "bounded", "time_limit_error"]

T = TypeVar("T")


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic()
    limit_s: float
    session_id: str


_CURRENT: ContextVar[_Deadline | None] = ContextVar("pie_debug_deadline", default=None)
#: whether a :func:`bounded` call's watchdog already guards this thread (a call within it needs none)
_WATCHED: ContextVar[bool] = ContextVar("pie_debug_watched", default=False)


class _TimeUp(BaseException):
    """Raised asynchronously in a backend call over the limit (a BaseException, so a backend's own
    ``except Exception`` does not swallow it); :func:`bounded` turns it into the DF007 error."""


def time_limit_error(limit_s: float, session_id: str) -> ResourceExhaustedError:
    """The error a validation over its time limit ends with."""
    return ResourceExhaustedError(
        f"exceeded max_session_duration ({limit_s:g} s)", session=session_id,
        hint="raise max_session_duration in the framework config (0 or None: no limit), or validate fewer "
             "layers or checkpoints; the rows written before the limit are kept",
    )


@contextlib.contextmanager
def session_deadline(limit_s: float | None, session_id: str) -> Iterator[None]:
    """The validation in this block (this thread) must finish within ``limit_s`` seconds (None: no limit)."""
    token = _CURRENT.set(None if limit_s is None else _Deadline(time.monotonic() + limit_s, limit_s, session_id))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def check_deadline() -> None:
    """Raise the time-limit error when the current validation is past its limit."""
    d = _CURRENT.get()
    if d is not None and time.monotonic() >= d.at:
        raise time_limit_error(d.limit_s, d.session_id)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc) if exc is not None else None)


class _Watchdog:
    """Raises :class:`_TimeUp` in one thread at a time unless disarmed first."""

    def __init__(self, thread_id: int, delay_s: float) -> None:
        self.thread_id = thread_id
        self.lock = threading.Lock()
        self.armed = True
        self.fired = False
        self.timer = threading.Timer(max(delay_s, 0.0), self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        with self.lock:
            if self.armed:
                self.fired = True
                _set_async_exc(self.thread_id, _TimeUp)

    def disarm(self) -> bool:
        """Stop the watchdog; True when it fired (a pending exception not yet delivered is cleared)."""
        self.timer.cancel()
        with self.lock:
            self.armed = False
            if self.fired:
                _set_async_exc(self.thread_id, None)
            return self.fired


def bounded(fn: Callable[[], T]) -> T:
    """``fn()``, interrupted when the current validation's time limit passes (see the module docstring).

    A call that returns although the watchdog fired keeps its result (the next boundary stops the
    validation); one that raises after it fired ends in the time-limit error, whatever it raised. A
    call made within a bounded call is guarded by that call's watchdog (one thread, not one per call:
    the decode stage bounds its whole loop of passes so).
    """
    d = _CURRENT.get()
    if d is None or _WATCHED.get():  # no limit, or the watchdog of a bounded call around this one guards it
        return fn()
    check_deadline()
    dog = _Watchdog(threading.get_ident(), d.at - time.monotonic())
    fired = False
    watched = _WATCHED.set(True)
    try:
        try:
            dog.timer.start()
            return fn()
        finally:
            fired = dog.disarm()  # no interruption can arrive after this
            _WATCHED.reset(watched)
    except BaseException as exc:
        if fired or isinstance(exc, _TimeUp):
            raise time_limit_error(d.limit_s, d.session_id) from None
        raise
