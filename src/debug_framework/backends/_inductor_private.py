"""The one place ``debug_framework`` touches a private ``torch._inductor`` API: the cache directory.

Inductor has no public switch for where it keeps compiled kernels and its FX graph cache; it reads
``TORCHINDUCTOR_CACHE_DIR`` (else ``<tmp>/torchinductor_<user>``) whenever it compiles. Only the
``inductor`` backend's ``cache_dir=`` option and the reported cache location use this module.
Checked against PyTorch 2.6 .. 2.13; another version fails here, once, with a clear error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..errors import BackendInitializationError

__all__ = ["cache_dir", "using_cache_dir", "TESTED_TORCH"]

TESTED_TORCH = ((2, 6), (2, 13))


def _check_version() -> None:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    lo, hi = TESTED_TORCH
    if not lo <= (major, minor) <= hi:
        raise BackendInitializationError(
            f"torch {torch.__version__} is outside the versions whose Inductor cache API was checked ({lo} .. {hi})",
            hint="update debug_framework/backends/_inductor_private.py for this PyTorch, or run without cache_dir=",
            backend="inductor",
        )


def cache_dir() -> str:
    """Where Inductor keeps its on-disk caches now (created if missing)."""
    _check_version()
    from torch._inductor.runtime.cache_dir_utils import cache_dir as _cache_dir

    return _cache_dir()


@contextlib.contextmanager
def using_cache_dir(directory: str | None) -> Iterator[None]:
    """Compile into ``directory`` (``None``: leave Inductor's own setting alone).

    Inductor's in-memory code caches are cleared on entry and exit so that nothing compiled for
    another directory is reused; compiled modules already loaded keep working.
    """
    if directory is None:
        yield
        return
    _check_version()
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(str(directory)):
        yield
