"""Result records of the comparison core."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..jsonio import JsonObject, dumps_json, json_safe
from .tolerance import Tolerance

__all__ = ["WorstElement", "ComparisonResult", "NestedComparison", "json_safe", "dumps_json"]


@dataclass(frozen=True, slots=True)
class WorstElement:
    """One of the k worst elements: its N-D index, both values, and the absolute error.

    ``abs_error`` is ``inf`` for a non-finite mismatch (NaN against a number, +inf against -inf...).
    """

    index: tuple[int, ...]
    reference: float | int | bool
    alternative: float | int | bool
    abs_error: float

    def to_dict(self) -> JsonObject:
        return {
            "index": list(self.index),
            "reference": self.reference,
            "alternative": self.alternative,
            "abs_error": self.abs_error,
        }


@dataclass(frozen=True, slots=True)
class ComparisonResult:
    """Every metric of one (reference, alternative) pair, the verdict, and the tolerance used.

    Error statistics (abs/rel/RMSE/L2/cosine/SQNR/quantiles/ULP) are over the pairs where both
    values are finite; non-finite values are counted separately and a non-finite disagreement is
    always a mismatch. Metrics are ``None`` where undefined (shape mismatch, no finite pairs).
    """

    passed: bool
    reason: str | None
    tolerance: Tolerance
    name: str = ""
    shape_match: bool = True
    dtype_match: bool = True
    reference_shape: tuple[int, ...] = ()
    alternative_shape: tuple[int, ...] = ()
    reference_dtype: str = ""
    alternative_dtype: str = ""
    numel: int = 0
    finite_count: int = 0
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    median_abs_error: float | None = None
    p99_abs_error: float | None = None
    quantiles_exact: bool = True
    max_rel_error: float | None = None
    mean_rel_error: float | None = None
    rmse: float | None = None
    rel_l2_error: float | None = None
    cosine_similarity: float | None = None
    sqnr_db: float | None = None
    mismatch_count: int = 0
    mismatch_percent: float = 0.0
    gross_mismatch_count: int = 0
    max_ulp_error: int | None = None
    ulp_dtype: str | None = None
    nan_count_ref: int = 0
    nan_count_alt: int = 0
    posinf_count_ref: int = 0
    neginf_count_ref: int = 0
    posinf_count_alt: int = 0
    neginf_count_alt: int = 0
    first_nonfinite_index: int | None = None
    nonfinite_mismatch_count: int = 0
    worst: list[WorstElement] = field(default_factory=list)
    #: padded positions (``[batch, sequence]`` rows) left out of every metric and of the verdict
    #: (``compare(..., positions=mask)``; docs/comparison.md, "Padded positions")
    masked_positions: int = 0

    @property
    def inf_count_ref(self) -> int:
        return self.posinf_count_ref + self.neginf_count_ref

    @property
    def inf_count_alt(self) -> int:
        return self.posinf_count_alt + self.neginf_count_alt

    def summary(self) -> str:
        """One line a person can read."""
        head = f"{self.name + ': ' if self.name else ''}{'PASS' if self.passed else 'FAIL'}"
        if not self.shape_match:
            return f"{head} ({self.reason})"
        parts = [head]
        if self.max_abs_error is not None:
            parts.append(f"max_abs={self.max_abs_error:.3e}")
            parts.append(f"mean_abs={self.mean_abs_error:.3e}")
        if self.max_ulp_error is not None:
            parts.append(f"max_ulp={self.max_ulp_error}")
        parts.append(f"mismatch={self.mismatch_count}/{self.numel} ({self.mismatch_percent:.4g}%)")
        if self.cosine_similarity is not None:
            parts.append(f"cos={self.cosine_similarity:.6f}")
        if self.reason and not self.passed:
            parts.append(f"-- {self.reason}")
        return " ".join(parts)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self, *, json_compatible: bool = False) -> JsonObject:
        """Every field as plain Python data (``json_compatible`` maps inf/nan to strings)."""
        out: JsonObject = {name: list(value) if isinstance(value := getattr(self, name), tuple) else value
                           for name in self.__dataclass_fields__}
        out["tolerance"] = self.tolerance.to_dict()
        out["worst"] = [w.to_dict() for w in self.worst]
        out["inf_count_ref"] = self.inf_count_ref
        out["inf_count_alt"] = self.inf_count_alt
        return json_safe(out) if json_compatible else out


@dataclass(frozen=True)
class NestedComparison:
    """Pairwise comparison of two nested outputs, leaf by leaf (``logits``, ``hidden_states.3``)."""

    results: dict[str, ComparisonResult]
    missing: list[str]  # leaves the alternative lacks
    extra: list[str]  # leaves only the alternative has

    @property
    def passed(self) -> bool:
        return not self.missing and not self.extra and all(r.passed for r in self.results.values())

    @property
    def failed_leaves(self) -> list[str]:
        return [k for k, r in self.results.items() if not r.passed]

    def summary(self) -> str:
        lines = [f"{'PASS' if self.passed else 'FAIL'}: {len(self.results)} leaves compared"]
        lines += [f"  {r.summary()}" for r in self.results.values()]
        lines += [f"  missing in alternative: {k}" for k in self.missing]
        lines += [f"  extra in alternative: {k}" for k in self.extra]
        return "\n".join(lines)

    def to_dict(self, *, json_compatible: bool = False) -> JsonObject:
        return {
            "passed": self.passed,
            "results": {k: r.to_dict(json_compatible=json_compatible) for k, r in self.results.items()},
            "missing": list(self.missing),
            "extra": list(self.extra),
        }
