"""Input normalisation and bounded-memory chunking.

Everything becomes a torch tensor without copying (NumPy arrays through ``torch.from_numpy``), then
is walked in C order in chunks of at most ``chunk`` elements. Contiguous inputs are sliced, never
copied; a non-contiguous input copies one chunk at a time.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..errors import ComparisonError

INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_UNSIGNED_FLOATS = {getattr(torch, n) for n in ("float8_e8m0fnu",) if hasattr(torch, n)}


def torch_dtype_of(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    except (TypeError, ValueError) as exc:
        raise ComparisonError(f"dtype {dtype!r} has no torch equivalent") from exc


def as_tensor(x: Any, side: str) -> torch.Tensor:
    """A tensor view of ``x`` (torch tensor, NumPy array or Python/NumPy scalar), no copy where possible."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, np.ndarray | np.generic):
        arr = np.asarray(x)
        if arr.dtype.kind not in "biuf":
            raise ComparisonError(
                f"{side} is a NumPy array of dtype {arr.dtype}, which cannot be compared numerically",
                hint="compare numeric arrays (bool, integer or floating point)",
            )
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only arrays: we never write through the view
            t = torch.from_numpy(arr)
    elif isinstance(x, bool | int | float):
        t = torch.tensor(x)
    else:
        raise ComparisonError(
            f"{side} is a {type(x).__name__}, not a tensor",
            hint="pass torch tensors, NumPy arrays or Python numbers",
        )
    if t.is_complex():
        raise ComparisonError(
            f"{side} is complex ({t.dtype}); complex tensors are not compared directly",
            hint="compare torch.view_as_real(x) of both sides",
        )
    if t.is_quantized or t.layout != torch.strided:
        raise ComparisonError(
            f"{side} has layout {t.layout}{' (quantized)' if t.is_quantized else ''}",
            hint="compare x.dequantize() / x.to_dense()",
        )
    return t


def iter_flat_chunks(t: torch.Tensor, chunk: int) -> Iterator[torch.Tensor]:
    """Contiguous 1-D pieces of ``t`` in C order, each at most ``chunk`` elements."""
    if t.dim() == 0:
        yield t.reshape(1)
        return
    n = t.numel()
    if n == 0:
        return
    if t.is_contiguous():
        flat = t.view(-1)
        for s in range(0, n, chunk):
            yield flat[s : s + chunk]
        return
    if t.dim() == 1:
        for s in range(0, n, chunk):
            yield t[s : s + chunk].contiguous()
        return
    row = n // t.shape[0]
    if row <= chunk:
        rows = max(1, chunk // row)
        for s in range(0, t.shape[0], rows):
            yield t[s : s + rows].reshape(-1)
    else:
        for i in range(t.shape[0]):
            yield from iter_flat_chunks(t[i], chunk)


def int_view_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype in _UNSIGNED_FLOATS:
        return torch.uint8
    return INT_VIEW[dtype.itemsize]


def ulp_mask(dtype: torch.dtype) -> int:
    """Magnitude mask of a float dtype's bit pattern (all bits for sign-less formats)."""
    bits = dtype.itemsize * 8
    if dtype in _UNSIGNED_FLOATS:
        return (1 << bits) - 1
    return (1 << (bits - 1)) - 1
