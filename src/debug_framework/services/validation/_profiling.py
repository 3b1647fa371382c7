"""Temporary home of the engine's profiling helpers (until debug_framework.measure lands)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _MemorySampler:
    """Peak memory while a block runs: CUDA's allocator peak on a CUDA device, else the process's
    resident set sampled every 2 ms (Linux ``/proc/self/statm``)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.result: dict[str, Any] = {}

    def __enter__(self) -> _MemorySampler:
        self._stop = threading.Event()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._base = _rss_bytes()
        self._peak = self._base or 0
        if self._base is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            v = _rss_bytes()
            if v is not None and v > self._peak:
                self._peak = v

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self.result = {"method": "torch.cuda.max_memory_allocated", "peak_bytes": int(peak),
                           "peak_increase_bytes": int(peak - self._base)}
            return
        if self._base is None:
            self.result = {"method": None, "note": "peak memory is not measurable on this platform"}
            return
        self._thread.join()
        v = _rss_bytes() or 0
        self._peak = max(self._peak, v)
        self.result = {"method": "resident set size, sampled every 2 ms", "peak_bytes": int(self._peak),
                       "peak_increase_bytes": int(self._peak - self._base)}


@contextmanager
def _layer_timer(backend: Any, enabled: bool) -> Iterator[dict[str, Any]]:
    """Per-layer wall time of one forward where measurable: forward hooks on the layer modules of a
    torch-module backend, or the per-layer function of the NumPy reference. Fills ``out``."""
    out: dict[str, Any] = {"per_layer_s": None, "method": None}
    if not enabled:
        yield out
        return
    starts: dict[int, float] = {}
    times: dict[int, float] = {}
    module = getattr(backend, "module", None)
    layer_modules = getattr(backend, "layer_modules", None)
    reference = getattr(backend, "reference", None)
    handles: list[Any] = []
    restore: Callable[[], None] | None = None
    device = str(getattr(backend, "device", "cpu"))

    def sync() -> None:
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    try:
        if module is not None and isinstance(layer_modules, Mapping) and layer_modules:
            from ...capture.hooks import find_module

            for i, name in layer_modules.items():
                mod = find_module(module, name)

                def pre(_m: Any, _a: Any, i: int = i) -> None:
                    sync()
                    starts[i] = time.perf_counter()

                def post(_m: Any, _a: Any, _o: Any, i: int = i) -> None:
                    sync()
                    times[i] = times.get(i, 0.0) + time.perf_counter() - starts.get(i, time.perf_counter())

                handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
            out["method"] = "forward hooks on the layer modules"
        elif reference is not None and callable(getattr(reference, "layer", None)):
            original = reference.layer

            def timed(i: int, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return original(i, *args, **kwargs)
                finally:
                    times[i] = times.get(i, 0.0) + time.perf_counter() - t0

            reference.layer = timed

            def restore() -> None:
                del reference.layer

            out["method"] = "timing of the reference's per-layer function"
        yield out
    finally:
        for h in handles:
            h.remove()
        if restore is not None:
            restore()
    n = getattr(getattr(backend, "model", None), "num_layers", None)
    if out["method"] and n and len(times) == n:
        out["per_layer_s"] = [times[i] for i in range(n)]
    elif out["method"]:
        out["note"] = "per-layer time not measurable: the layers did not run one by one (compiled or fused)"
        out["method"] = None
