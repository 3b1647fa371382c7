"""Tolerances: per-dtype defaults, pass rules, overrides."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypeAlias

import numpy as np

from ..jsonio import JsonObject

if TYPE_CHECKING:
    import torch

__all__ = ["PassRule", "Tolerance", "default_tolerance", "less_precise_dtype", "DType"]

#: A torch or NumPy dtype (or what ``np.dtype`` reads: a name, a scalar type).
DType: TypeAlias = "torch.dtype | np.dtype | type | str"

PassRule = Literal["allclose", "mismatch", "both"]
_RULES = ("allclose", "mismatch", "both")

# torch.testing.assert_close's documented defaults (rtol, atol), by dtype name (torch's names, which
# NumPy shares for the dtypes both have: a NumPy comparison never imports torch). float8 types are
# not in its table; for them we use half an ULP at 1.0 of the format as rtol (2**-4 for e4m3, 2**-3
# for e5m2) and the smallest normal as atol -- the same construction torch uses for float16/bfloat16.
_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "float8_e4m3fn": (2.0**-4, 2.0**-6),
    "float8_e4m3fnuz": (2.0**-4, 2.0**-7),
    "float8_e5m2": (2.0**-3, 2.0**-14),
    "float8_e5m2fnuz": (2.0**-3, 2.0**-15),
    "float8_e8m0fnu": (1.0, 2.0**-127),
}


#: The machine epsilon of each floating dtype a session computes in, by name (NumPy has no bfloat16).
DTYPE_EPS: dict[str, float] = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def is_torch_dtype(dtype: DType) -> bool:
    """Whether ``dtype`` is a ``torch.dtype`` (without importing torch: none exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dtype, torch.dtype)


def is_float_dtype(dtype: DType) -> bool:
    """Whether a torch or NumPy dtype is a floating-point one."""
    return bool(dtype.is_floating_point) if is_torch_dtype(dtype) else np.dtype(dtype).kind == "f"


def dtype_name(dtype: DType) -> str:
    """torch's name of a torch or NumPy dtype (``float32``, ``int64``, ``bool``)."""
    return str(dtype).removeprefix("torch.") if is_torch_dtype(dtype) else np.dtype(dtype).name


def float_eps(dtype: DType) -> float:
    """The machine epsilon of a torch or NumPy float dtype."""
    if is_torch_dtype(dtype):
        return float(sys.modules["torch"].finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def numpy_dtype_of(dtype: DType) -> np.dtype:
    """``dtype`` as a NumPy dtype torch also has; DF006 for anything else."""
    from ..errors import ComparisonError

    try:
        d = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise ComparisonError(f"dtype {dtype!r} has no torch equivalent") from exc
    if d.kind not in "biufc" or (d.kind == "f" and d.itemsize > 8) or (d.kind == "c" and d.itemsize > 16):
        raise ComparisonError(f"dtype {dtype!r} has no torch equivalent")
    return d


def _precision_rank(dtype: DType) -> float:
    """Larger = less precise. Integers and bool are exact (rank 0)."""
    return float_eps(dtype) if is_float_dtype(dtype) else 0.0


def less_precise_dtype(a: DType, b: DType) -> DType:
    """The dtype whose precision governs a comparison of ``a`` against ``b`` (torch or NumPy dtypes)."""
    return a if _precision_rank(a) >= _precision_rank(b) else b


@dataclass(frozen=True)
class Tolerance:
    """How close is close enough, and how a pair passes.

    An element matches when ``|alt - ref| <= atol + rtol * |ref|`` (NaN matches NaN only with
    ``equal_nan``; an infinity matches only the same infinity).

    Pass rules:
        ``"allclose"``: every element matches.
        ``"mismatch"``: at most ``max_mismatch_percent`` % of elements miss.
        ``"both"``: at most ``max_mismatch_percent`` % miss, and none misses by more than
        ``outlier_factor`` times its bound (a few small misses are tolerated, a wild one is not).
    """

    rtol: float
    atol: float
    equal_nan: bool = False
    pass_rule: PassRule = "allclose"
    max_mismatch_percent: float = 0.0
    outlier_factor: float = 10.0

    def __post_init__(self) -> None:
        from ..errors import ComparisonError

        if self.pass_rule not in _RULES:
            raise ComparisonError(
                f"unknown pass rule {self.pass_rule!r}", hint=f"use one of {', '.join(_RULES)}"
            )
        for name in ("rtol", "atol", "max_mismatch_percent"):
            v = getattr(self, name)
            if not (v >= 0.0):
                raise ComparisonError(f"{name} must be a non-negative number, got {v!r}")
        if not self.outlier_factor >= 1.0:
            raise ComparisonError(f"outlier_factor must be >= 1, got {self.outlier_factor!r}")

    def with_overrides(self, **overrides: float | bool | str | None) -> Tolerance:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def passes(self, mismatches: int, mismatch_percent: float, gross_mismatches: int) -> bool:
        """The pass rule on a comparison's counts: ``allclose``, no element outside ``atol + rtol *
        |ref|``; ``mismatch``, at most ``max_mismatch_percent`` of them; ``both``, that and none
        beyond ``outlier_factor`` times the bound."""
        if self.pass_rule == "allclose":
            return mismatches == 0
        if self.pass_rule == "mismatch":
            return mismatch_percent <= self.max_mismatch_percent
        return mismatch_percent <= self.max_mismatch_percent and gross_mismatches == 0

    def to_dict(self) -> JsonObject:
        """Every field by name (what ``dataclasses.asdict`` gives for these scalar fields, without
        its deep copy: a decode writes one per stored row)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Tolerance:
        fields = {"rtol", "atol", "equal_nan", "pass_rule", "max_mismatch_percent", "outlier_factor"}
        return cls(**{k: v for k, v in data.items() if k in fields})


def default_tolerance(dtype: DType) -> Tolerance:
    """torch.testing's default (rtol, atol) for ``dtype`` (a torch or NumPy dtype); exact (0, 0)
    for integers and bool."""
    if not is_torch_dtype(dtype):
        dtype = numpy_dtype_of(dtype)
    rtol, atol = _DEFAULTS.get(dtype_name(dtype), (0.0, 0.0))
    return Tolerance(rtol=rtol, atol=atol)
