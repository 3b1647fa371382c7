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
from typing import TYPE_CHECKING, TypedDict, Unpack

from debug_framework.comparison import ComparisonResult, PassRule, Tolerance, compare
from debug_framework.config import check_keywords

if TYPE_CHECKING:
    import numpy as np
    import torch

    from debug_framework.jsonio import JsonObject

__all__ = ["TensorComparisonResult", "compare_tensors", "ToleranceOptions", "CompareTolerance", "core_tolerance"]


class ToleranceOptions(TypedDict, total=False):
    """KernelDiff's tolerance keywords (the spec's names). Each overrides one field of ``tolerance``
    (default: torch.testing's for the less precise dtype); ``None`` leaves it as it is."""

    rtol: float | None
    atol: float | None
    equal_nan: bool | None
    pass_rule: PassRule | None
    max_mismatch_percentage: float | None
    tolerance: Tolerance | None


class CompareTolerance(TypedDict, total=False):
    """The same options under :func:`debug_framework.comparison.compare`'s keyword names."""

    rtol: float | None
    atol: float | None
    equal_nan: bool | None
    pass_rule: PassRule | None
    max_mismatch_percent: float | None
    tolerance: Tolerance | None


def core_tolerance(options: ToleranceOptions) -> CompareTolerance:
    """``compare``'s keywords for KernelDiff's (``max_mismatch_percentage`` is the core's
    ``max_mismatch_percent``). Raises ``TypeError`` for a keyword that is not a tolerance option."""
    check_keywords(options, ToleranceOptions, "compare_tensors")
    out: CompareTolerance = {k: v for k, v in options.items() if k != "max_mismatch_percentage"}
    out["max_mismatch_percent"] = options.get("max_mismatch_percentage")
    return out


def _alias(field: str, doc: str) -> property:
    """A read-only attribute that is the core result's ``field`` under the spec's name."""
    return property(lambda self: getattr(self.result, field), doc=doc)


@dataclass(frozen=True)
class TensorComparisonResult:
    """The core's :class:`ComparisonResult` under the spec's names. Unknown attributes fall through to it."""

    result: ComparisonResult

    passed = _alias("passed", "The verdict.")
    max_absolute_error = _alias("max_abs_error", "Largest |test - reference| (``None`` when nothing was compared).")
    mean_absolute_error = _alias("mean_abs_error", "Mean |test - reference| over the finite pairs.")
    max_relative_error = _alias("max_rel_error", "Largest |test - reference| / |reference|.")
    mean_relative_error = _alias("mean_rel_error", "Mean relative error over the finite pairs.")
    rmse = _alias("rmse", "Root mean square error over the finite pairs.")
    mismatch_percentage = _alias("mismatch_percent", "Share of elements outside the tolerance, in %.")
    nan_count = _alias("nan_count_alt", "NaNs in the tested tensor.")
    inf_count = _alias("inf_count_alt", "Infinities in the tested tensor.")

    @property
    def worst_index(self) -> tuple[int, ...] | None:
        """N-D index of the largest error (``None`` when nothing was compared)."""
        return self.result.worst[0].index if self.result.worst else None

    def __getattr__(self, name: str) -> object:
        if name == "result":  # pragma: no cover - only during unpickling-like partial init
            raise AttributeError(name)
        return getattr(self.result, name)

    def summary(self) -> str:
        return self.result.summary()

    def to_dict(self, *, json_compatible: bool = True) -> JsonObject:
        return self.result.to_dict(json_compatible=json_compatible)

    def __str__(self) -> str:
        return self.result.summary()


def compare_tensors(reference: torch.Tensor | np.ndarray, test: torch.Tensor | np.ndarray, *, check_dtype: bool = True, top_k: int = 5, name: str = "",
                    **tolerance_options: Unpack[ToleranceOptions]) -> TensorComparisonResult:
    """Compare ``test`` against ``reference`` with :func:`debug_framework.comparison.compare`.

    ``tolerance_options``: ``rtol``, ``atol``, ``equal_nan``, ``pass_rule``, ``max_mismatch_percentage`` and
    a base ``tolerance`` (see :class:`ToleranceOptions`); ``check_dtype``, ``top_k`` and ``name`` as in
    ``compare``."""
    return TensorComparisonResult(compare(reference, test, check_dtype=check_dtype, top_k=top_k, name=name,
                                          **core_tolerance(tolerance_options)))
