"""``compare_tensors``: the spec's tensor comparison, a thin front over the comparison core.

    >>> import torch
    >>> from debug_module.diff import compare_tensors
    >>> r = compare_tensors(torch.ones(3), torch.ones(3) + 1e-7)
    >>> r.passed, r.max_absolute_error < 1e-6
    (True, True)

Every number comes from :func:`debug_framework.comparison.compare`; this module only renames
fields to the spec's names (``max_absolute_error``, ``mismatch_percentage`` ...) and keeps the
core's :class:`~debug_framework.comparison.ComparisonResult` in ``.result``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from debug_framework.comparison import ComparisonResult, PassRule, Tolerance, compare

__all__ = ["TensorComparisonResult", "compare_tensors"]


@dataclass(frozen=True)
class TensorComparisonResult:
    """The core's :class:`ComparisonResult` under the spec's names. Unknown attributes fall through to it."""

    result: ComparisonResult

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def max_absolute_error(self) -> float | None:
        return self.result.max_abs_error

    @property
    def mean_absolute_error(self) -> float | None:
        return self.result.mean_abs_error

    @property
    def max_relative_error(self) -> float | None:
        return self.result.max_rel_error

    @property
    def mean_relative_error(self) -> float | None:
        return self.result.mean_rel_error

    @property
    def rmse(self) -> float | None:
        return self.result.rmse

    @property
    def mismatch_percentage(self) -> float:
        return self.result.mismatch_percent

    @property
    def worst_index(self) -> tuple[int, ...] | None:
        """N-D index of the largest error (``None`` when nothing was compared)."""
        return self.result.worst[0].index if self.result.worst else None

    @property
    def nan_count(self) -> int:
        """NaNs in the tested tensor."""
        return self.result.nan_count_alt

    @property
    def inf_count(self) -> int:
        """Infinities in the tested tensor."""
        return self.result.inf_count_alt

    def __getattr__(self, name: str) -> Any:
        if name == "result":  # pragma: no cover - only during unpickling-like partial init
            raise AttributeError(name)
        return getattr(self.result, name)

    def summary(self) -> str:
        return self.result.summary()

    def to_dict(self, *, json_compatible: bool = True) -> dict[str, Any]:
        return self.result.to_dict(json_compatible=json_compatible)

    def __str__(self) -> str:
        return self.result.summary()


def compare_tensors(
    reference: Any,
    test: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool | None = None,
    pass_rule: PassRule | None = None,
    max_mismatch_percentage: float | None = None,
    tolerance: Tolerance | None = None,
    check_dtype: bool = True,
    top_k: int = 5,
    name: str = "",
) -> TensorComparisonResult:
    """Compare ``test`` against ``reference`` with the comparison core (see its ``compare`` for the
    tolerance rules; the default tolerance is torch.testing's for the less precise dtype)."""
    return TensorComparisonResult(
        compare(reference, test, rtol=rtol, atol=atol, equal_nan=equal_nan, pass_rule=pass_rule,
                max_mismatch_percent=max_mismatch_percentage, tolerance=tolerance, check_dtype=check_dtype,
                top_k=top_k, name=name)
    )
