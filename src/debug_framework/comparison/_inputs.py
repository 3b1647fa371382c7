"""Input normalisation and bounded-memory chunking.

A pair with a torch tensor on either side becomes torch tensors without copying (NumPy arrays
through ``torch.from_numpy``); a pair of NumPy arrays and Python numbers stays NumPy
(:func:`as_array`), so comparing NumPy values never imports torch. Either is walked in C order in
chunks of at most ``chunk`` elements. Contiguous inputs are sliced, never copied; a non-contiguous
input copies one chunk at a time.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from ..errors import ComparisonError
from .tolerance import DType, dtype_name, is_torch_dtype

if TYPE_CHECKING:
    import torch

#: One side of a comparison once normalised: a torch tensor or a NumPy array.
Array: TypeAlias = "torch.Tensor | np.ndarray"

_UNSIGNED_FLOAT_NAMES = frozenset({"float8_e8m0fnu"})
#: The NumPy dtype of a Python number, as ``torch.tensor`` makes it (float32: torch's default dtype).
_SCALAR_DTYPES = ((bool, np.bool_), (int, np.int64), (float, np.float32))


def is_tensor(x: object) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch: none exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def torch_dtype_of(dtype: DType) -> torch.dtype:
    if is_torch_dtype(dtype):
        return dtype
    import torch

    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    except (TypeError, ValueError) as exc:
        raise ComparisonError(f"dtype {dtype!r} has no torch equivalent") from exc


def _numeric_array(x: object, side: str) -> np.ndarray:
    """A NumPy array or scalar as a native-byte-order numeric array (DF006 for anything else)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf" or (arr.dtype.kind == "f" and arr.dtype.itemsize > 8):
        raise ComparisonError(
            f"{side} is a NumPy array of dtype {arr.dtype}, which cannot be compared numerically",
            hint="compare numeric arrays (bool, integer or floating point)",
        )
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def _not_a_tensor(x: object, side: str) -> ComparisonError:
    return ComparisonError(
        f"{side} is a {type(x).__name__}, not a tensor",
        hint="pass torch tensors, NumPy arrays or Python numbers",
    )


def as_array(x: object, side: str) -> np.ndarray:
    """A NumPy view of ``x`` (NumPy array or Python/NumPy scalar; Python numbers get the dtype
    ``torch.tensor`` would give them), no copy where possible."""
    if isinstance(x, np.ndarray | np.generic):
        return _numeric_array(x, side)
    for kind, dtype in _SCALAR_DTYPES:
        if isinstance(x, kind):
            return np.asarray(x, dtype=dtype)
    raise _not_a_tensor(x, side)


def as_tensor(x: object, side: str) -> torch.Tensor:
    """A tensor view of ``x`` (torch tensor, NumPy array or Python/NumPy scalar), no copy where possible."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, np.ndarray | np.generic):
        arr = _numeric_array(x, side)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only arrays: we never write through the view
            t = torch.from_numpy(arr)
    elif isinstance(x, bool | int | float):
        t = torch.tensor(x)
    else:
        raise _not_a_tensor(x, side)
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


def iter_flat_chunks(t: Array, chunk: int) -> Iterator[Array]:
    """Contiguous 1-D pieces of ``t`` (a torch tensor or NumPy array) in C order, each at most
    ``chunk`` elements: the same pieces, in the same order, for either."""
    numpy = isinstance(t, np.ndarray)
    if t.ndim == 0:
        yield t.reshape(1)
        return
    n = t.size if numpy else t.numel()
    if n == 0:
        return
    if t.flags.c_contiguous if numpy else t.is_contiguous():
        flat = t.reshape(-1)  # a view of contiguous data
        for s in range(0, n, chunk):
            yield flat[s : s + chunk]
        return

    def contiguous(x: Array) -> Array:
        return np.ascontiguousarray(x) if numpy else x.contiguous()

    if t.ndim == 1:
        for s in range(0, n, chunk):
            yield contiguous(t[s : s + chunk])
        return
    row = n // t.shape[0]
    if row <= chunk:
        rows = max(1, chunk // row)
        for s in range(0, t.shape[0], rows):
            yield contiguous(t[s : s + rows]).reshape(-1)
    else:
        for i in range(t.shape[0]):
            yield from iter_flat_chunks(t[i], chunk)


def int_view_dtype(dtype: DType) -> DType:
    """The integer dtype (torch's for a torch dtype, NumPy's for a NumPy one) of a float dtype's bit patterns."""
    if is_torch_dtype(dtype):
        import torch

        if dtype_name(dtype) in _UNSIGNED_FLOAT_NAMES:
            return torch.uint8
        return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    return np.dtype(f"int{8 * np.dtype(dtype).itemsize}")


def ulp_mask(dtype: DType) -> int:
    """Magnitude mask of a float dtype's bit pattern (all bits for sign-less formats)."""
    bits = dtype.itemsize * 8
    if dtype_name(dtype) in _UNSIGNED_FLOAT_NAMES:
        return (1 << bits) - 1
    return (1 << (bits - 1)) - 1
