"""The spec's ``TensorComparisonEngine``: a thin, dict-speaking front over the comparison core.

All numbers come from :func:`debug_framework.comparison.compare`; nothing is computed twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from ..comparison import Tolerance, compare

__all__ = ["TensorComparisonEngine"]

#: The keys of a tolerance dict that are used (``compare``'s tolerance overrides); others are ignored.
_TOLERANCE_KEYS = frozenset(f.name for f in fields(Tolerance))


class TensorComparisonEngine:
    """Compare tensors with a tolerance given as a dict, returning JSON-ready dicts."""

    def __init__(self, default_tolerance_config: Mapping[str, Any] | None = None, *, top_k: int = 5) -> None:
        self.default_tolerance_config = dict(default_tolerance_config or {})
        self.top_k = top_k

    def compare_tensors(
        self, reference_tensor: Any, alternative_tensor: Any, tolerance: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Compare two tensors; ``tolerance`` holds ``rtol``/``atol`` (and optionally the other
        :class:`~debug_framework.comparison.Tolerance` fields) over the engine's defaults and the
        dtype's. Returns every metric plus ``match_status``, ``max_absolute_error``,
        ``max_relative_error`` and ``tolerance_config``."""
        merged = {**self.default_tolerance_config, **(tolerance or {})}
        overrides = {k: v for k, v in merged.items() if k in _TOLERANCE_KEYS}
        res = compare(reference_tensor, alternative_tensor, check_dtype=False, top_k=self.top_k, **overrides)
        out = res.to_dict(json_compatible=True)
        out.update(
            match_status=res.passed,
            max_absolute_error=out["max_abs_error"],
            max_relative_error=out["max_rel_error"],
            tolerance_config=res.tolerance.to_dict(),
        )
        return out

    def analyze_differences(self, reference_tensor: Any, alternative_tensor: Any) -> dict[str, Any]:
        """Detailed error analysis: the error distribution, worst elements, non-finite values and
        the tightest (atol, rtol) each pair would pass with."""
        res = compare(reference_tensor, alternative_tensor, check_dtype=False, top_k=max(self.top_k, 10))
        d = res.to_dict(json_compatible=True)
        return {
            "distribution": {k: d[k] for k in ("max_abs_error", "mean_abs_error", "median_abs_error", "p99_abs_error", "rmse")},
            "relative": {k: d[k] for k in ("max_rel_error", "mean_rel_error", "rel_l2_error")},
            "similarity": {k: d[k] for k in ("cosine_similarity", "sqnr_db", "max_ulp_error", "ulp_dtype")},
            "non_finite": {k: d[k] for k in ("nan_count_ref", "nan_count_alt", "inf_count_ref", "inf_count_alt", "first_nonfinite_index", "nonfinite_mismatch_count")},
            "worst_elements": d["worst"],
            "needed_atol_at_rtol_0": d["max_abs_error"],
            "needed_rtol_at_atol_0": d["max_rel_error"],
            "shape": d["reference_shape"],
            "dtypes": [d["reference_dtype"], d["alternative_dtype"]],
        }

    def generate_comparison_report(self, comparison_results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Summarise many ``compare_tensors`` results: counts, pass rate, the worst entry."""
        results = list(comparison_results)
        passed = [r for r in results if r.get("match_status", r.get("passed"))]
        numeric = [r for r in results if isinstance(r.get("max_abs_error"), int | float)]
        worst = max(numeric, key=lambda r: r["max_abs_error"], default=None)
        return {
            "total": len(results),
            "passed": len(passed),
            "failed": len(results) - len(passed),
            "pass_rate": (len(passed) / len(results)) if results else None,
            "worst": None if worst is None else {"name": worst.get("name", ""), "max_abs_error": worst["max_abs_error"]},
            "failed_names": [r.get("name", "") for r in results if r not in passed],
        }
