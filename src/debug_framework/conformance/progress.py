"""The op sweep's progress: samples judged per operator, and an estimate of the time left.

    >>> from debug_framework.conformance.results import OpResult
    >>> ticks = iter([0.0, 60.0, 60.0])
    >>> p = SweepProgress(clock=lambda: next(ticks))
    >>> r = OpResult("exp", "pass", 1.0, None, {"pass": 24, "samples": 24}, seconds=60.0)
    >>> p.line(r, 1, 4)
    '1/4 exp: pass, 24 samples judged (24 pass); 1m 00s elapsed, about 3m 00s left'

The estimate is the wall time per operator the sweep has run so far (operators read back from the
database or skipped before running cost nothing and are not counted) times the operators left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .results import FAILING, OpResult

__all__ = ["SweepProgress", "samples_text", "judged", "duration_text"]


def judged(counts: dict[str, int]) -> int:
    """Samples judged: those that passed or failed (error, crash and hang included); skipped and
    unsupported samples are not judged."""
    return sum(int(counts.get(k, 0)) for k in ("pass", *FAILING))


def samples_text(counts: dict[str, int]) -> str:
    """``24 samples judged (22 pass, 2 fail), 3 skipped`` from an operator's (or a sweep's) counts;
    with ``widened_by_noise``, how many passed or failed on a bound widened by measured noise."""
    n = judged(counts)
    parts = [f"{counts[k]} {k}" for k in ("pass", *FAILING) if counts.get(k)]
    text = f"{n} sample{'' if n == 1 else 's'} judged" + (f" ({', '.join(parts)})" if parts else "")
    others = [f"{counts[k]} {k}" for k in ("unsupported", "skipped") if counts.get(k)]
    if others:
        text += ", " + ", ".join(others)
    if counts.get("widened_by_noise"):
        text += f"; {counts['widened_by_noise']} on a bound widened by measured noise"
    return text


def duration_text(seconds: float) -> str:
    """``42s``, ``3m 05s`` or ``1h 02m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


@dataclass
class SweepProgress:
    """Counts what the sweep has run, from the first call on (``clock``: seconds, monotonic)."""

    clock: Callable[[], float] = time.monotonic
    started: float = field(default=math.nan)
    ran: int = 0  # operators run in this sweep (not read back, not skipped before running)

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def record(self, r: OpResult) -> None:
        """Count ``r`` if the sweep ran it (it took time: not read back or skipped statically)."""
        if r.seconds > 0:
            self.ran += 1

    def elapsed(self) -> float:
        return self.clock() - self.started

    def eta(self, done: int, total: int) -> float | None:
        """Seconds left: the elapsed time per operator run so far times the operators left (None
        before the first operator has run; 0 when none is left)."""
        if done >= total:
            return 0.0
        if self.ran == 0:
            return None
        return self.elapsed() / self.ran * (total - done)

    def line(self, r: OpResult, done: int, total: int) -> str:
        """Record ``r`` and return its progress line: the operator, its verdict, its samples, the time
        elapsed and the estimate of the time left."""
        self.record(r)
        left = self.eta(done, total)
        when = f"{duration_text(self.elapsed())} elapsed" + (
            "" if left is None else (", done" if left == 0 else f", about {duration_text(left)} left"))
        return f"{done}/{total} {r.op}: {r.verdict}, {samples_text(r.counts)}; {when}"
