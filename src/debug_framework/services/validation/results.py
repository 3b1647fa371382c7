"""What a validation computed: per-checkpoint outcomes, per-layer isolation and the whole result.

Plain data with JSON views (``to_dict``) and the database row of a checkpoint (``row``); the
stages fill them, the stores and reports read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...capture.keys import CheckpointKey
import math

from ...comparison import ComparisonResult, OracleJudgement, RatioVerdict, error_metric
from ...jsonio import json_safe
from ..drilldown.types import LayerDrilldown

__all__ = ["CheckpointOutcome", "LayerIsolation", "ValidationResult", "error_source"]

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
    judgement: RatioVerdict | None = None  # the calibrated verdict (None: judged by a tolerance)
    noise: ComparisonResult | None = None  # the calibration run against the reference here
    introduced_judgement: RatioVerdict | None = None  # the replay's calibrated verdict
    tolerance_margin: float | None = None  # max |a - r| / (atol + rtol |r|) where judged by a tolerance
    accumulation: dict[str, float | None] | None = None  # the layer's carried in / out and growth (isolation)

    @property
    def introduces_error(self) -> bool | None:
        if self.introduced_judgement is not None:
            return not self.introduced_judgement.passed
        return None if self.introduced is None else not self.introduced.passed

    @property
    def fails_by_isolation(self) -> bool:
        """Whether isolation fails this checkpoint: its layer's calibrated replay verdict where there
        is one; the replay's fixed tolerance only where the checkpoint itself is judged by a
        tolerance (never overriding a calibrated or oracle verdict with a fixed tolerance)."""
        if self.introduced_judgement is not None:
            return not self.introduced_judgement.passed
        return self.judged_by == "tolerance" and bool(self.introduces_error)

    @property
    def judged_by(self) -> str:
        """What decided ``passed``: ``"oracle"``, ``"calibration"`` or ``"tolerance"``."""
        return "oracle" if self.oracle is not None else "calibration" if self.judgement is not None else "tolerance"

    @property
    def bound(self) -> float | None:
        """The bound the error was judged by (metric units; None for an elementwise tolerance)."""
        j = self.oracle if self.oracle is not None else self.judgement.judgement if self.judgement else None
        return None if j is None else j.bound

    @property
    def margin(self) -> float | None:
        """error / bound (at most 1 passes): the ratio rule's, else the tolerance's."""
        j = self.oracle if self.oracle is not None else self.judgement.judgement if self.judgement else None
        return self.tolerance_margin if j is None else j.margin

    def judgement_dict(self) -> dict[str, Any]:
        """How the verdict was reached: the rule, its bound and the margin."""
        out: dict[str, Any] = {"judged_by": self.judged_by, "bound": self.bound, "margin": self.margin}
        if self.judgement is not None:
            out["calibrated"] = self.judgement.to_dict()
        if self.introduced_judgement is not None:
            out["introduced_judgement"] = self.introduced_judgement.to_dict()
        return out

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
        d["judgement"] = self.judgement_dict()
        d["bound"], d["margin"] = self.bound, self.margin
        if self.accumulation is not None:
            d["accumulation"] = dict(self.accumulation)
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
            "noise": _metrics(self.noise),
            "accumulation": self.accumulation,
            **self.judgement_dict(),
        })


def _rmse(result: ComparisonResult | None) -> float | None:
    value = None if result is None else error_metric(result, "rmse")
    return None if value is None or math.isnan(value) else value


def _growth(into: float | None, out: float | None) -> float | None:
    """out / in: how much the error grows through a layer (None when unmeasured or nothing came in)."""
    if into is None or out is None:
        return None
    return (math.inf if out > 0 else 1.0) if into == 0 else out / into


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
    #: the calibrated verdicts of the replays (None: judged by the replay comparison's tolerance)
    attention_judgement: RatioVerdict | None = None
    mlp_judgement: RatioVerdict | None = None
    #: the calibration run's own error at the layer's input and output (the accumulation of a correct run)
    noise_in: ComparisonResult | None = None
    noise_out: ComparisonResult | None = None

    def _fails(self, judgement: RatioVerdict | None, comparison: ComparisonResult | None) -> bool:
        if judgement is not None:
            return not judgement.passed
        return comparison is not None and not comparison.passed

    @property
    def introduces(self) -> bool:
        return self.block is not None

    @property
    def block(self) -> str | None:
        """Where the error starts inside the layer: ``"attention"``, ``"mlp"`` or None."""
        if self._fails(self.attention_judgement, self.introduced_attention):
            return "attention"
        return "mlp" if self._fails(self.mlp_judgement, self.introduced_mlp) else None

    def accumulation(self) -> dict[str, float | None]:
        """Carried in vs carried out (RMSE at the layer's input and output in the full run) and the
        growth through the layer, beside the calibration run's own (a correct run's accumulation)."""
        e_in, e_out = _rmse(self.carried_in), _rmse(self.total)
        n_in, n_out = _rmse(self.noise_in), _rmse(self.noise_out)
        return {"carried_in_rmse": e_in, "carried_out_rmse": e_out, "growth": _growth(e_in, e_out),
                "calibration_in_rmse": n_in, "calibration_out_rmse": n_out, "calibration_growth": _growth(n_in, n_out)}

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
            **self.accumulation(),
            "attention_judgement": None if self.attention_judgement is None else self.attention_judgement.to_dict(),
            "mlp_judgement": None if self.mlp_judgement is None else self.mlp_judgement.to_dict(),
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
    #: the op-level drill-down, one entry per drilled layer (None: not requested)
    drilldown: list[LayerDrilldown] | None = None

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

    @property
    def error_source(self) -> dict[str, Any] | None:
        """Where a failed validation's error comes from (:func:`error_source`); None when it passed."""
        return error_source(self.results, self.isolation, self.isolation_note)

    def summary(self) -> dict[str, Any]:
        """The session's ``results`` summary (what reports read)."""
        first = self.first_divergence
        return json_safe({
            "verdict": self.verdict,
            "checkpoints": len(self.results),
            "failed": sum(not r.passed for r in self.results),
            "first_divergence": None if first is None else _first_divergence_dict(first),
            "introducing_layers": self.introducing_layers if self.isolation is not None else None,
            "error_source": self.error_source,
            "isolation": None if self.isolation is None else [i.to_dict() for i in self.isolation],
            "isolation_note": self.isolation_note,
            "oracle": self.oracle,
            "noise_floor": self.noise_floor,
            "performance": self.performance,
            "recordings": self.recordings,
            "drilldown": None if self.drilldown is None else [d.to_dict() for d in self.drilldown],
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
        **o.judgement_dict(),
    }


def _block(key: CheckpointKey) -> str | None:
    return {"post_attention": "attention", "post_mlp": "mlp"}.get(key.name)


def error_source(results: list[CheckpointOutcome], isolation: list[LayerIsolation] | None,
                 isolation_note: str | None = None) -> dict[str, Any] | None:
    """Where the error of a failed validation comes from: ``kind`` is ``"embedding"`` (the embedding
    output already diverges), ``"layer"`` (``layer`` and ``block``: the first layer introducing error
    on its own, or, without isolation, the first layer where it shows: ``confirmed`` False),
    ``"head"`` (every per-layer checkpoint within its bound, the final norm / head output not) or
    ``"accumulation"`` (no layer introduces more than a correct run's replay error, yet the error
    carried through the layers grows beyond the bound at ``layer``). None when nothing failed."""
    first = next((r for r in results if not r.passed), None)
    if first is None:
        return None
    key = first.key
    if key.name == "post_embedding":
        return {"kind": "embedding", "layer": None, "block": None, "confirmed": True,
                "detail": "the embedding output already diverges (post_embedding)"}
    intro = [iso for iso in isolation or [] if iso.introduces]
    if intro and (key.layer is None or intro[0].layer <= key.layer):
        iso = intro[0]
        return {"kind": "layer", "layer": iso.layer, "block": iso.block, "confirmed": True,
                "detail": f"layer {iso.layer} ({iso.block}) introduces error on its own: its replay on the "
                          "reference's input exceeds its bound"}
    if key.layer is None:
        return {"kind": "head", "layer": None, "block": None, "confirmed": isolation is not None,
                "detail": "the final norm / head: every enabled per-layer checkpoint is within its bound, "
                          f"{key} is not"}
    if isolation is None:
        return {"kind": "layer", "layer": key.layer, "block": _block(key), "confirmed": False,
                "detail": f"the error first shows in layer {key.layer} ({key}); isolation did not run "
                          f"({isolation_note or 'off'}), so this is where it shows, not confirmed as its source"}
    return {"kind": "accumulation", "layer": key.layer, "block": _block(key), "confirmed": True,
            "detail": f"no layer introduces more error than its bound on its own, yet the error carried through "
                      f"the layers exceeds the bound at {key} (see each layer's growth)"}
