"""The leading side of a decode run ahead in a worker thread (docs/validation.md, "Decode steps").

The reference chooses the tokens (or reads the given ones) and depends on no other side, so its
passes can be computed while the alternative runs the step before and the step is judged: on a
machine with a second core a validated step then costs about the longest of the reference's pass
and the alternative's pass with its judgement, not their sum. :class:`PassesAhead` takes the passes
of one backend's decode from a worker thread, at most :data:`AHEAD` of them waiting (their tensors
are one step's checkpoints and new cache entries), in order. The worker runs in a copy of the
caller's context (its session deadline and watchdog state), a backend's failure there is raised in
the caller at the step it belongs to, exactly as the backend's own call would have raised it, and
:meth:`PassesAhead.close` stops the worker after its current pass and then closes the decode (in the
caller's thread). Only a backend declaring ``Capabilities.decode_ahead`` runs so.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator

from ...backends.decode import DecodePass

__all__ = ["PassesAhead", "AHEAD"]

#: how many passes the worker computes ahead of the step being judged
AHEAD = 2
#: how often a waiting side wakes (to let the session's watchdog interrupt it)
_POLL_S = 0.05


class PassesAhead:
    """The passes of ``stream`` (``steps + 1`` of them: the prefill, then one per step), each taken
    by ``take(stream, step)`` in a worker thread, handed out in order by :meth:`next`."""

    def __init__(self, stream: Iterator[DecodePass], steps: int,
                 take: Callable[[Iterator[DecodePass], int], DecodePass], name: str) -> None:
        self.stream = stream
        self._steps, self._take = steps, take
        self._ready: queue.Queue[tuple[DecodePass | None, BaseException | None]] = queue.Queue(maxsize=AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._produce,),
                                        name=f"decode-ahead-{name}", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for s in range(self._steps + 1):
                if self._stop.is_set():
                    return
                if not self._put((self._take(self.stream, s), None)):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller, at its step
            self._put((None, exc))

    def _put(self, item: tuple[DecodePass | None, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> DecodePass:
        """The next pass, as soon as the worker has it; the worker's exception where its call failed."""
        while True:
            try:
                got, error = self._ready.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._ready.empty():
                    raise RuntimeError("the decode worker ended without a pass") from None  # a bug of ours
                continue
            if error is not None:
                raise error
            assert got is not None
            return got

    def close(self) -> None:
        """Stop the worker (after the pass it is computing), then close the decode it read."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._ready.get_nowait()
            except queue.Empty:
                self._thread.join(_POLL_S)
        close = getattr(self.stream, "close", None)
        if callable(close):
            close()
