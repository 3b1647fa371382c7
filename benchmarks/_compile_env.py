"""Compile-cache control for the benchmark runner (peak memory, timing and statistics come from
:mod:`debug_framework.measure`).

Private PyTorch APIs (``torch._dynamo``, ``torch._inductor``) are reached only through the project's
private-API layer ``debug_framework._torch`` (version-checked), never imported here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["inductor_cache_dir", "clear_inprocess_compile_caches", "dynamo_reset", "lookup_backend"]


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
