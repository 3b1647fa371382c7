"""Compile-cache control and peak-memory probes for the benchmark runner.

Private PyTorch APIs (``torch._dynamo``, ``torch._inductor``) are reached only through the project's
private-API layer ``debug_framework._torch`` (version-checked), never imported here.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["inductor_cache_dir", "clear_inprocess_compile_caches", "dynamo_reset", "lookup_backend", "PeakMemory"]


def dynamo_reset() -> None:
    """Forget every compiled frame and guard (process-wide)."""
    from debug_framework._torch import dynamo

    dynamo.reset()


def lookup_backend(name: str) -> Callable[..., Any]:
    """A registered torch.compile backend (``"inductor"``) as a callable."""
    from debug_framework._torch import dynamo

    return dynamo.lookup_backend(name)


@contextlib.contextmanager
def inductor_cache_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Point Inductor's on-disk caches (FX graph cache, compiled kernels, autotuning) at ``path`` for the block.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` each time it needs the cache directory, so setting the
    variable switches caches without restarting the process; ``TRITON_CACHE_DIR`` follows it on CUDA."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(p)
    os.environ["TRITON_CACHE_DIR"] = str(p / "triton")
    try:
        yield p
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def clear_inprocess_compile_caches() -> None:
    """Forget every compiled frame (Dynamo) and Inductor's in-memory caches (loaded kernel modules,
    compiled C++ libraries keyed by source hash), so the next compile cannot reuse this process's work."""
    from debug_framework._torch import inductor

    dynamo_reset()
    inductor.clear_caches()


class PeakMemory:
    """High-water mark of memory over a block.

    CPU (Linux): resident set size. ``reset()`` writes ``5`` to ``/proc/self/clear_refs``, which resets
    the kernel's ``VmHWM`` (peak RSS) to the current RSS; ``peak()`` reads ``VmHWM``. Where that is not
    possible the peak is ``ru_maxrss`` since process start (``method`` says which; it cannot be reset).
    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (tensor memory only).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method = "cuda_max_memory_allocated" if device.type == "cuda" else self._cpu_method()
        self.baseline: int | None = None

    @staticmethod
    def _cpu_method() -> str:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return "rss_vmhwm"
        except OSError:
            return "ru_maxrss_since_start"

    @staticmethod
    def _status(field: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
        elif self.method == "rss_vmhwm":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.baseline = self._status("VmRSS")
        else:
            self.baseline = None

    def peak(self) -> dict[str, int | str | None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = int(torch.cuda.max_memory_allocated(self.device))
        elif self.method == "rss_vmhwm":
            peak = self._status("VmHWM")
        else:
            ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            peak = ru if sys.platform == "darwin" else ru * 1024
        base = self.baseline
        return {"peak_bytes": peak, "baseline_bytes": base,
                "delta_bytes": (peak - base) if peak is not None and base is not None else None,
                "method": self.method}
