"""What a validation computed: per-checkpoint outcomes, per-layer isolation and the whole result.

Plain data with JSON views (``to_dict``) and the database row of a checkpoint (``row``); the
stages fill them, the stores and reports read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...capture.keys import CheckpointKey
from ...comparison import ComparisonResult, OracleJudgement, error_metric
from ...jsonio import json_safe

__all__ = ["CheckpointOutcome", "LayerIsolation", "ValidationResult"]

_SUMMARY_METRICS = ("max_abs_error", "mean_abs_error", "rmse", "rel_l2_error", "cosine_similarity",
                    "mismatch_percent", "max_ulp_error")


def _metrics(result: ComparisonResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    out = {m: getattr(result, m) for m in _SUMMARY_METRICS}
    out["passed"] = result.passed
    out["reason"] = result.reason
    return out


@dataclass
class CheckpointOutcome:
    """One enabled checkpoint: the comparison, the verdict used, and isolation/oracle details."""

    key: CheckpointKey
    comparison: ComparisonResult
    passed: bool
    reason: str | None
    introduced: ComparisonResult | None = None  # the alternative's single-layer replay on the reference's input
    carried_in: ComparisonResult | None = None  # the error at the layer's input in the full run
    oracle: OracleJudgement | None = None
    run_to_run: dict[str, float] | None = None  # noise floor: max |run1 - run2| per side

    @property
    def introduces_error(self) -> bool | None:
        return None if self.introduced is None else not self.introduced.passed

    def row(self) -> dict[str, Any]:
        """The database row: every metric of the comparison plus the engine's fields."""
        d = self.comparison.to_dict()
        d.update(checkpoint=self.key.name, layer=self.key.layer, passed=self.passed, reason=self.reason,
                 tolerance_passed=self.comparison.passed)
        if self.introduced is not None:
            d["introduced_error"] = error_metric(self.introduced, "max_abs_error")
            d["introduces_error"] = self.introduces_error
            d["introduced"] = _metrics(self.introduced)
        if self.carried_in is not None:
            d["propagated_error"] = error_metric(self.carried_in, "max_abs_error")
        if self.oracle is not None:
            d["oracle"] = self.oracle.to_dict()
        if self.run_to_run is not None:
            d["run_to_run"] = dict(self.run_to_run)
        return d

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            **self.key.to_json(),
            "passed": self.passed,
            "reason": self.reason,
            "metrics": _metrics(self.comparison),
            "tolerance": self.comparison.tolerance.to_dict(),
            "introduced": _metrics(self.introduced),
            "carried_in": _metrics(self.carried_in),
            "introduces_error": self.introduces_error,
            "oracle": None if self.oracle is None else self.oracle.to_dict(),
            "run_to_run": self.run_to_run,
        })


@dataclass
class LayerIsolation:
    """What layer ``layer`` does to the error: introduced (replayed on the reference's input) vs
    carried in (the error at its input in the full run) vs total (its output in the full run)."""

    layer: int
    carried_in: ComparisonResult
    introduced_attention: ComparisonResult | None
    introduced_mlp: ComparisonResult
    total: ComparisonResult | None
    alternative_replay_s: float = 0.0

    @property
    def introduces(self) -> bool:
        attn = self.introduced_attention is not None and not self.introduced_attention.passed
        return attn or not self.introduced_mlp.passed

    @property
    def block(self) -> str | None:
        """Where the error starts inside the layer: ``"attention"``, ``"mlp"`` or None."""
        if self.introduced_attention is not None and not self.introduced_attention.passed:
            return "attention"
        return "mlp" if not self.introduced_mlp.passed else None

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "layer": self.layer,
            "introduces_error": self.introduces,
            "block": self.block,
            "introduced_error": error_metric(self.introduced_mlp, "max_abs_error"),
            "propagated_error": error_metric(self.carried_in, "max_abs_error"),
            "total_error": error_metric(self.total, "max_abs_error") if self.total is not None else None,
            "introduced_attention": _metrics(self.introduced_attention),
            "introduced_mlp": _metrics(self.introduced_mlp),
            "carried_in": _metrics(self.carried_in),
            "alternative_replay_s": self.alternative_replay_s,
        })


@dataclass
class ValidationResult:
    """Everything one validation computed: per-checkpoint outcomes in model order, the verdict,
    the first divergence, isolation per layer, oracle/noise-floor reports and performance."""

    session_id: str
    model_path: str
    reference_backend: str
    alternative_backend: str
    reference_dtype: str
    alternative_dtype: str
    results: list[CheckpointOutcome]
    isolation: list[LayerIsolation] | None = None
    isolation_note: str | None = None
    oracle: dict[str, Any] | None = None
    noise_floor: dict[str, Any] | None = None
    performance: dict[str, Any] = field(default_factory=dict)
    recordings: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"

    @property
    def first_divergence(self) -> CheckpointOutcome | None:
        """The earliest checkpoint (model order) that failed."""
        return next((r for r in self.results if not r.passed), None)

    @property
    def introducing_layers(self) -> list[int]:
        """Layers that introduce error on their own (isolation), even after an earlier divergence."""
        return [iso.layer for iso in self.isolation or [] if iso.introduces]

    def summary(self) -> dict[str, Any]:
        """The session's ``results`` summary (what reports read)."""
        first = self.first_divergence
        return json_safe({
            "verdict": self.verdict,
            "checkpoints": len(self.results),
            "failed": sum(not r.passed for r in self.results),
            "first_divergence": None if first is None else _first_divergence_dict(first),
            "introducing_layers": self.introducing_layers if self.isolation is not None else None,
            "isolation": None if self.isolation is None else [i.to_dict() for i in self.isolation],
            "isolation_note": self.isolation_note,
            "oracle": self.oracle,
            "noise_floor": self.noise_floor,
            "performance": self.performance,
            "recordings": self.recordings,
            "reference_dtype": self.reference_dtype,
            "alternative_dtype": self.alternative_dtype,
        })

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite floats as "NaN"/"Infinity"/"-Infinity" strings)."""
        return json_safe({
            "session_id": self.session_id,
            "model_path": self.model_path,
            "reference_backend": self.reference_backend,
            "alternative_backend": self.alternative_backend,
            **self.summary(),
            "results": [r.to_dict() for r in self.results],
        })


def _first_divergence_dict(o: CheckpointOutcome) -> dict[str, Any]:
    c = o.comparison
    return {
        **o.key.to_json(),
        "reason": o.reason,
        "max_abs_error": c.max_abs_error,
        "mean_abs_error": c.mean_abs_error,
        "max_rel_error": c.max_rel_error,
        "rel_l2_error": c.rel_l2_error,
        "cosine_similarity": c.cosine_similarity,
        "mismatch_percent": c.mismatch_percent,
        "tolerance": c.tolerance.to_dict(),
        "worst": [w.to_dict() for w in c.worst[:3]],
        "introduces_error": o.introduces_error,
        "oracle": None if o.oracle is None else o.oracle.to_dict(),
    }
