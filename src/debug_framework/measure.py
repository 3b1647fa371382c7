"""Measuring: device synchronisation, timed blocks, run statistics, peak memory, per-layer time and
a timed ``torch.compile`` backend. One implementation of each, used by the validation engine, the
backends, KernelDiff and the benchmarks.

    from debug_framework.measure import PeakMemory, Timer, run_stats

    with PeakMemory("cuda") as mem, Timer("cuda") as t:
        model(x)
    t.seconds, mem.result.peak_bytes
    run_stats([0.010, 0.012, 0.011], unit="ms")      # {"mean": 11.0, "std": 1.0, ...}

This module sits at the bottom of the layering (it imports nothing of the project at import time)
and imports torch only when a CUDA device is named, so ``import debug_framework`` stays fast.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

__all__ = [
    "synchronize",
    "Timer",
    "run_stats",
    "MemoryPeak",
    "PeakMemory",
    "LayerTiming",
    "layer_timer",
    "TimedBackend",
]

def _device_type(device: str | torch.device | None) -> str:
    if device is None:
        return "cpu"
    if isinstance(device, str):
        return device.split(":", 1)[0]
    return device.type


def synchronize(device: str | torch.device | None) -> None:
    """Wait for the work queued on ``device`` (CUDA), so a timer brackets the work and not its launch.

    A no-op on the CPU (torch is not even imported)."""
    if _device_type(device) == "cuda":
        import torch

        torch.cuda.synchronize(device)


class Timer:
    """Wall time of a block, with ``device`` synchronised on entry and on exit.

        with Timer(device) as t:
            model(x)
        t.seconds
    """

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = device
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Timer:
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start


def run_stats(samples_s: Sequence[float], *, unit: Literal["s", "ms"] = "s",
              count_key: str = "samples") -> dict[str, float | int | None]:
    """Mean, std (sample, ``None`` under two samples), median, min and max of timings given in seconds,
    reported in ``unit``; ``count_key`` names the number of samples (``"samples"``; the benchmarks'
    JSON says ``"runs"``). No samples: every statistic is ``None``."""
    scale = 1000.0 if unit == "ms" else 1.0
    xs = [s * scale for s in samples_s]
    return {
        "mean": statistics.fmean(xs) if xs else None,
        "std": statistics.stdev(xs) if len(xs) > 1 else None,
        "median": statistics.median(xs) if xs else None,
        "min": min(xs) if xs else None,
        "max": max(xs) if xs else None,
        count_key: len(xs),
    }


# ---------------------------------------------------------------------------------------------- peak memory

_CUDA = "cuda_max_memory_allocated"
_HWM = "rss_vmhwm"
_SAMPLED = "rss_sampled_2ms"
_RU_MAXRSS = "ru_maxrss_since_start"


def _proc_status_bytes(field_name: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes, ``None`` where unreadable."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rss_bytes() -> int | None:
    """The resident set size now (Linux ``/proc/self/statm``), ``None`` where unreadable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS; ``False`` where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _cpu_method() -> str | None:
    if _reset_hwm() and _proc_status_bytes("VmHWM") is not None:
        return _HWM
    if _rss_bytes() is not None:
        return _SAMPLED
    return _RU_MAXRSS if sys.platform != "win32" else None


@dataclass(frozen=True)
class MemoryPeak:
    """The high-water mark of one measured block. ``delta_bytes``: the rise over the level at the start."""

    method: str | None
    peak_bytes: int | None = None
    baseline_bytes: int | None = None
    note: str | None = None

    @property
    def delta_bytes(self) -> int | None:
        if self.peak_bytes is None or self.baseline_bytes is None:
            return None
        return self.peak_bytes - self.baseline_bytes

    def to_dict(self) -> dict[str, int | str | None]:
        d: dict[str, int | str | None] = {"peak_bytes": self.peak_bytes, "baseline_bytes": self.baseline_bytes,
                                          "delta_bytes": self.delta_bytes, "method": self.method}
        if self.note:
            d["note"] = self.note
        return d


class PeakMemory:
    """Peak memory while a block runs (a context manager; reusable, not re-entrant).

    ``method`` says how, chosen once per instance:

    * ``cuda_max_memory_allocated`` (a CUDA device): the allocator's peak after ``reset_peak_memory_stats``
      (tensor memory only);
    * ``rss_vmhwm`` (Linux): the kernel's resident-set high-water mark, reset on entry by writing ``5``
      to ``/proc/self/clear_refs`` (process-wide: do not nest two measurements);
    * ``rss_sampled_2ms`` (Linux where that reset is not allowed): the resident set sampled every 2 ms
      by a daemon thread;
    * ``ru_maxrss_since_start`` (macOS, BSD): the process's peak since it started (no reset, no baseline);
    * ``None``: not measurable (the result says so in ``note``).

        with PeakMemory(device) as mem:
            run()
        mem.result.peak_bytes, mem.result.to_dict()
    """

    def __init__(self, device: str | torch.device | None = None, *, sample_interval_s: float = 0.002) -> None:
        self.device = device
        self.sample_interval_s = sample_interval_s
        self.method = _CUDA if _device_type(device) == "cuda" else _cpu_method()
        self.result = MemoryPeak(self.method, note="not measured yet")
        self._baseline: int | None = None
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        self._baseline = self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.result = MemoryPeak(self.method, self._finish(), self._baseline,
                                 note=None if self.method else "peak memory is not measurable on this platform")

    def _start(self) -> int | None:
        if self.method == _CUDA:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return int(torch.cuda.memory_allocated(self.device))
        if self.method == _HWM:
            _reset_hwm()
            return _proc_status_bytes("VmRSS")
        if self.method == _SAMPLED:
            base = _rss_bytes()
            self._peak = base or 0
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, name="PeakMemory", daemon=True)
            self._thread.start()
            return base
        return None

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_interval_s):
            self._peak = max(self._peak, _rss_bytes() or 0)

    def _finish(self) -> int | None:
        if self.method == _CUDA:
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.method == _HWM:
            return _proc_status_bytes("VmHWM")
        if self.method == _SAMPLED:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            return max(self._peak, _rss_bytes() or 0)
        if self.method == _RU_MAXRSS:
            ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return int(ru if sys.platform == "darwin" else ru * 1024)
        return None


# ---------------------------------------------------------------------------------------------- per-layer time


class _Removable(Protocol):
    def remove(self) -> None: ...


class _Hookable(Protocol):
    """What a layer module offers (``torch.nn.Module``): forward hooks."""

    def register_forward_pre_hook(self, hook: Callable[..., None]) -> _Removable: ...
    def register_forward_hook(self, hook: Callable[..., None]) -> _Removable: ...


@dataclass
class LayerTiming:
    """Per-layer wall time of one forward: ``per_layer_s[i]`` for layer ``i``, ``method`` how it was
    measured; both ``None`` (with a ``note``) where the layers did not run one by one."""

    per_layer_s: list[float] | None = None
    method: str | None = None
    note: str | None = None
    _times: dict[int, float] = field(default_factory=dict, repr=False)

    def add(self, layer: int, seconds: float) -> None:
        self._times[layer] = self._times.get(layer, 0.0) + seconds

    def finish(self, num_layers: int | None) -> None:
        """Fill ``per_layer_s`` when every one of ``num_layers`` layers was timed."""
        if self.method and num_layers and len(self._times) == num_layers:
            self.per_layer_s = [self._times[i] for i in range(num_layers)]
        elif self.method:
            self.note = "per-layer time not measurable: the layers did not run one by one (compiled or fused)"
            self.method = None


def _hook_layers(timing: LayerTiming, modules: Mapping[int, _Hookable], device: str) -> list[_Removable]:
    starts: dict[int, float] = {}
    handles: list[_Removable] = []
    for i, mod in modules.items():
        def pre(_m: object, _a: object, i: int = i) -> None:
            synchronize(device)
            starts[i] = time.perf_counter()

        def post(_m: object, _a: object, _o: object, i: int = i) -> None:
            synchronize(device)
            timing.add(i, time.perf_counter() - starts.get(i, time.perf_counter()))

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    timing.method = "forward hooks on the layer modules"
    return handles


def _wrap_reference_layer(timing: LayerTiming, reference: object) -> Callable[[], None]:
    original: Callable[..., object] = getattr(reference, "layer")

    def timed(i: int, *args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return original(i, *args, **kwargs)
        finally:
            timing.add(i, time.perf_counter() - t0)

    setattr(reference, "layer", timed)
    timing.method = "timing of the reference's per-layer function"
    return lambda: delattr(reference, "layer")


@contextmanager
def layer_timer(backend: object, enabled: bool = True) -> Iterator[LayerTiming]:
    """Per-layer wall time of one forward of ``backend`` where measurable: forward hooks on the layer
    modules of a torch-module backend (``backend.module`` and ``backend.layer_modules``, index -> module
    name), or timing the per-layer function of the NumPy reference (``backend.reference.layer``).
    The yielded :class:`LayerTiming` is complete when the block exits."""
    timing = LayerTiming()
    if not enabled:
        yield timing
        return
    module = getattr(backend, "module", None)
    layer_modules = getattr(backend, "layer_modules", None)
    reference = getattr(backend, "reference", None)
    device = str(getattr(backend, "device", "cpu"))
    handles: list[_Removable] = []
    restore: Callable[[], None] | None = None
    try:
        if module is not None and isinstance(layer_modules, Mapping) and layer_modules:
            from .capture.hooks import find_module

            handles = _hook_layers(timing, {i: find_module(module, n) for i, n in layer_modules.items()}, device)
        elif reference is not None and callable(getattr(reference, "layer", None)):
            restore = _wrap_reference_layer(timing, reference)
        yield timing
    finally:
        for h in handles:
            h.remove()
        if restore is not None:
            restore()
    timing.finish(getattr(getattr(backend, "model", None), "num_layers", None))


# ---------------------------------------------------------------------------------------------- compile backends


def _snapshot(x: object) -> object:
    """A clone of a tensor (same shape, strides, dtype, ``requires_grad`` of a leaf); anything else as is.
    Elements that share memory (an ``expand``'s stride 0, as a graph after a graph break is given) keep
    sharing it in the clone: the span of storage the tensor covers is cloned and viewed with its strides
    (``copy_`` into such a layout is refused)."""
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    t = x.detach()
    if t.numel() == 0:
        c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    else:
        span = 1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride()))
        with torch.no_grad():
            flat = t.as_strided((span,), (1,), t.storage_offset()).clone()
        c = flat.as_strided(t.shape, t.stride(), 0)
    return c.requires_grad_(True) if x.requires_grad and x.is_leaf else c


class TimedBackend:
    """Wraps a ``torch.compile`` backend: counts the graphs it gets and the seconds spent inside its
    compiler (``compile_s``); with ``keep_graphs`` also keeps each ``(graph module, example inputs)``,
    the inputs as clones taken before the graph first runs (a graph that changes its inputs in place
    does not change what is kept)."""

    def __init__(self, inner: Callable[..., Callable[..., object]], *, keep_graphs: bool = False) -> None:
        self.inner = inner
        self.keep_graphs = keep_graphs
        self.compile_s = 0.0
        self.calls = 0
        self.graphs: list[tuple[torch.fx.GraphModule, list[object]]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable[..., object]:
        self.calls += 1
        if self.keep_graphs:
            self.graphs.append((gm, [_snapshot(x) for x in example_inputs]))
        t0 = time.perf_counter()
        try:
            return self.inner(gm, example_inputs)
        finally:
            self.compile_s += time.perf_counter() - t0
