"""The typed result of a validation: one record per checkpoint, one per isolated layer, the whole.

:class:`CheckpointResult` joins what was measured at a checkpoint (:mod:`.evidence`) with the one
judgement the judge gave it (:mod:`.judge`). Its JSON (:meth:`CheckpointResult.to_dict`) is the
only shape a checkpoint result has: the CLI's ``--json``, the stored row (:meth:`to_row` adds the
database's indexed columns, :meth:`from_row` reads it back), the reports and the dashboard all
carry it. Each checkpoint is named by one canonical ``id`` (``post_attention:1``; a decode step,
when there is one, adds ``@step``) beside its structured fields. The schema is documented in
``docs/validation.md`` ("The result's JSON").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from ...capture.keys import CheckpointKey
from ...checkpoint_ids import checkpoint_id
from ...comparison import ComparisonResult, Tolerance, error_metric
from ...comparison.ratio import OracleJudgement
from ...errors import DatabaseError
from ...jsonio import JsonObject, JsonValue, as_float, json_safe
from ..drilldown.types import LayerDrilldown
from .decode_record import DecodeRecord
from .evidence import BlockEvidence, CheckpointEvidence, Evidence, LayerEvidence
from .judge import FLIPS_REASON, Judgement, LayerVerdict, Verdict

if TYPE_CHECKING:
    from ...storage.database import DatabaseLike

__all__ = ["CheckpointResult", "BlockResult", "LayerResult", "ValidationResult", "Introducer", "ErrorSource", "brief"]

#: the tolerance of a comparison read back from a row no tolerance judged (none was stored)
_NO_TOLERANCE = Tolerance(rtol=0.0, atol=0.0)
#: ComparisonResult fields that are not measurements (the allclose verdict is the judge's business).
_NOT_METRICS = ("passed", "reason", "tolerance", "name")
#: Judged metrics in the output's own units: their bound over RMS(reference) is a relative change.
_SCALE_METRICS = ("rmse", "max_abs_error")


def brief(result: ComparisonResult | None) -> JsonObject | None:
    """A comparison in two numbers: ``max_abs_error`` and ``rmse`` (None without one)."""
    if result is None:
        return None
    return {"max_abs_error": error_metric(result, "max_abs_error"), "rmse": error_metric(result, "rmse")}


def _metrics(result: ComparisonResult) -> JsonObject:
    d = result.to_dict()
    for k in _NOT_METRICS:
        d.pop(k, None)
    return d


def _comparison_from(row: Mapping[str, JsonValue], passed: bool) -> ComparisonResult:
    """A stored row's metrics as a :class:`ComparisonResult` (the fields it has; the rest default)."""
    from ...comparison.result import WorstElement

    kwargs: dict[str, object] = {}
    for f in fields(ComparisonResult):
        if f.name in _NOT_METRICS or f.name not in row or row[f.name] is None:
            continue
        value = row[f.name]
        if f.name == "worst":
            value = [WorstElement(tuple(w.get("index") or ()), w.get("reference"), w.get("alternative"),
                                  w.get("abs_error")) for w in value if isinstance(w, Mapping)]
        elif f.name.endswith("_shape"):
            value = tuple(value)
        elif isinstance(value, str) and f.name not in ("reference_dtype", "alternative_dtype", "ulp_dtype"):
            value = as_float(value)
        kwargs[f.name] = value
    tol = row.get("tolerance")  # stored only where a tolerance judged the row; else none is implied (0, 0)
    # a first-release row may name one of rtol/atol: the other was 0
    tolerance = Tolerance.from_dict({"rtol": 0.0, "atol": 0.0, **tol}) if isinstance(tol, Mapping) else _NO_TOLERANCE
    return ComparisonResult(passed=passed, reason=None, tolerance=tolerance, **kwargs)


@dataclass(frozen=True)
class BlockResult:
    """The block of a layer that ends at a checkpoint, replayed alone and judged."""

    block: str
    input: str
    judgement: Judgement
    error: ComparisonResult

    def to_dict(self) -> JsonObject:
        return {"block": self.block, "input": self.input, **self.judgement.to_dict(), **(brief(self.error) or {})}


@dataclass(slots=True)
class CheckpointResult:
    """One checkpoint: what was measured there and the one judgement it got.

    Attributes:
        key: the checkpoint; ``id`` is its canonical name.
        comparison: the alternative against the reference (the metrics).
        judgement: the verdict, by exactly one rule, with its bound and margin.
        noise: the calibration run's error here (a correct implementation's), when calibrated.
        introduced: the block that ends here, replayed on the reference's input (isolation).
        carried_in: the error at the layer's input in the full run (isolation).
        run_to_run: the noise floor's max |run1 - run2| per side.
        accumulation: the layer's carried-in / carried-out RMSE and growth (isolation).
        step: the decode step (None: the prefill pass). module: the module path, where known.
        reference_rms: the reference output's RMS here (the scale of :attr:`detectable_change`).
    """

    key: CheckpointKey
    comparison: ComparisonResult
    judgement: Judgement
    noise: ComparisonResult | None = None
    introduced: BlockResult | None = None
    carried_in: ComparisonResult | None = None
    run_to_run: dict[str, float] | None = None
    accumulation: dict[str, float | None] | None = None
    step: int | None = None
    module: str | None = None
    #: False for a stored row that carries no verdict (written through the records' API unjudged)
    judged: bool = True
    #: the introduced error of a stored row that kept no replayed block's judgement (records' API)
    introduced_figure: float | None = None
    reference_rms: float | None = None

    @property
    def id(self) -> str:
        return checkpoint_id(self.key.name, self.key.layer, self.step)

    @property
    def passed(self) -> bool:
        return self.judgement.passed

    @property
    def state(self) -> bool | None:
        """The verdict, None where the row carries none (a view shows it as skipped / unknown)."""
        return self.judgement.passed if self.judged else None

    @property
    def reason(self) -> str | None:
        return self.judgement.reason

    @property
    def judged_by(self) -> str:
        return self.judgement.judged_by

    @property
    def bound(self) -> float | None:
        return self.judgement.bound

    @property
    def margin(self) -> float | None:
        return self.judgement.margin

    @property
    def judged_metric(self) -> str | None:
        """The metric the rule held to :attr:`bound` (``"rmse"``, ``"max_abs_error"``,
        ``"kl_divergence"``); ``"allclose"`` for an elementwise tolerance (no bound: its margin is
        ``max |a - r| / (atol + rtol |r|)``); None where the row kept no rule."""
        if self.judgement.rule is not None:
            return self.judgement.rule.metric
        return "allclose" if self.judged_by == "tolerance" and self.judged else None

    @property
    def judged_error(self) -> float | None:
        """The error in :attr:`judged_metric`'s units, the figure held to :attr:`bound` (None: no rule
        kept; for a tolerance its margin is the figure)."""
        rule = self.judgement.rule
        if rule is not None:
            return None if math.isnan(rule.alternative_error) else rule.alternative_error
        return None

    @property
    def detectable_change(self) -> float | None:
        """The smallest relative change of this checkpoint's output its bound would catch: the
        bound over the reference's RMS here, for a bound in the output's units (RMSE or max abs
        error). A change of relative size ``d`` spread over the output adds about ``d x RMS(ref)``
        to the RMSE, so below this figure a change (a layer scaled by ``1 + d``) passes as noise.
        None for other rules (an elementwise tolerance, token metrics) or an unmeasured scale."""
        rms, bound = self.reference_rms, self.bound
        if self.judged_metric not in _SCALE_METRICS or rms is None or bound is None:
            return None
        if not (math.isfinite(rms) and math.isfinite(bound)) or rms <= 0:
            return None
        return bound / rms

    @property
    def tolerance(self) -> Tolerance | None:
        """The elementwise tolerance that judged the checkpoint (None: another rule judged it)."""
        tol = self.comparison.tolerance
        return tol if self.judged_by == "tolerance" and tol is not _NO_TOLERANCE else None

    @property
    def introduced_error(self) -> float | None:
        """Max |error| of the block ending here, replayed on the reference's input (isolation)."""
        if self.introduced is None:
            return self.introduced_figure
        return error_metric(self.introduced.error, "max_abs_error")

    @property
    def propagated_error(self) -> float | None:
        """Max |error| carried into the layer in the full run (isolation)."""
        return None if self.carried_in is None else error_metric(self.carried_in, "max_abs_error")

    @property
    def introduces_error(self) -> bool | None:
        """Whether the block ending here introduces error on the reference's input (None: not judged)."""
        return None if self.introduced is None else not self.introduced.judgement.passed

    def to_dict(self) -> JsonObject:
        """The one JSON shape of a checkpoint result (documented in docs/validation.md)."""
        return json_safe({
            "id": self.id, **self.key.to_json(), "step": self.step, "module": self.module,
            **self.judgement.to_dict(),
            "consistent_with": self.judgement.consistent_with,
            **_metrics(self.comparison),
            "tolerance": None if self.tolerance is None else self.tolerance.to_dict(),
            "noise": brief(self.noise),
            "introduces_error": self.introduces_error,
            "introduced": None if self.introduced is None else self.introduced.to_dict(),
            "carried_in": brief(self.carried_in),
            "run_to_run": self.run_to_run,
            "accumulation": self.accumulation,
            "judged_metric": self.judged_metric,
            "judged_error": self.judged_error,
            "reference_rms": self.reference_rms,
            "detectable_change": self.detectable_change,
        })

    def to_row(self) -> JsonObject:
        """The stored row: :meth:`to_dict` plus the database's indexed error columns."""
        return {**self.to_dict(), "introduced_error": self.introduced_error, "propagated_error": self.propagated_error}

    @classmethod
    def from_row(cls, row: Mapping[str, JsonValue]) -> CheckpointResult:
        """Read a stored row back (:meth:`to_row`'s shape; the schema migrates rows stored before it)."""
        layer = row.get("layer")
        key = CheckpointKey(str(row["checkpoint"]), None if layer is None else int(str(layer)))
        judgement = judgement_from(row)
        intro = row.get("introduced")
        introduced = None
        if isinstance(intro, Mapping) and "judged_by" in intro:
            introduced = BlockResult(str(intro.get("block")), str(intro.get("input")), judgement_from(intro),
                                     brief_comparison(intro) or _no_comparison())
        elif isinstance(row.get("introduces_error"), bool):  # the records' API: the verdict and the figure
            introduced = BlockResult("attention" if key.name == "post_attention" else "mlp", "reference",
                                     Judgement.from_dict({"passed": not row["introduces_error"], "judged_by": "isolation"}),
                                     ComparisonResult(True, None, _NO_TOLERANCE,
                                                      max_abs_error=as_float(row.get("introduced_error"))))
        step = row.get("step")
        module = row.get("module")
        carried = brief_comparison(row.get("carried_in"))
        if carried is None and row.get("propagated_error") is not None:  # a row with the figure alone
            carried = ComparisonResult(True, None, _NO_TOLERANCE, max_abs_error=as_float(row.get("propagated_error")))
        return cls(key=key, comparison=_comparison_from(row, judgement.passed), judgement=judgement,
                   noise=brief_comparison(row.get("noise")), introduced=introduced, carried_in=carried,
                   introduced_figure=None if introduced is not None else as_float(row.get("introduced_error")),
                   run_to_run=_floats(row.get("run_to_run")), accumulation=_optional_floats(row.get("accumulation")),
                   step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                   module=module if isinstance(module, str) else None, judged=row.get("passed") is not None,
                   reference_rms=as_float(row.get("reference_rms")))


def judgement_from(data: Mapping[str, JsonValue]) -> Judgement:
    """A stored judgement read back with its ratio rule (``rule``: metric, error, baseline_error,
    multiplier, floor), where one decided."""
    judgement = Judgement.from_dict(data)
    rule = data.get("rule")
    if not isinstance(rule, Mapping) or rule.get("metric") is None:
        return judgement
    numbers = [as_float(rule.get(k)) for k in ("baseline_error", "error", "multiplier", "floor")]
    return replace(judgement, rule=OracleJudgement(str(rule["metric"]), *(math.nan if v is None else v for v in numbers)))


def brief_comparison(data: JsonValue) -> ComparisonResult | None:
    """A :func:`brief` read back: a comparison with its ``max_abs_error`` and ``rmse`` (None for none)."""
    if not isinstance(data, Mapping):
        return None
    return ComparisonResult(True, None, _NO_TOLERANCE, max_abs_error=as_float(data.get("max_abs_error")),
                            rmse=as_float(data.get("rmse")))


def _no_comparison() -> ComparisonResult:
    """A comparison that measured nothing (every metric None)."""
    return ComparisonResult(True, None, _NO_TOLERANCE)


def _floats(data: JsonValue) -> dict[str, float] | None:
    """A stored ``{name: number}`` object (numbers that are not finite stored as strings read back)."""
    if not isinstance(data, Mapping):
        return None
    return {str(k): v for k, v in ((k, as_float(v)) for k, v in data.items()) if v is not None}


def _optional_floats(data: JsonValue) -> dict[str, float | None] | None:
    """A stored ``{name: number or null}`` object."""
    return None if not isinstance(data, Mapping) else {str(k): as_float(v) for k, v in data.items()}


def _rmse(result: ComparisonResult | None) -> float | None:
    value = None if result is None else error_metric(result, "rmse")
    return None if value is None or math.isnan(value) else value


def _growth(into: float | None, out: float | None) -> float | None:
    """out / in: how much the error grows through a layer (None when unmeasured or nothing came in)."""
    if into is None or out is None:
        return None
    return (math.inf if out > 0 else 1.0) if into == 0 else out / into


@dataclass(frozen=True)
class LayerResult:
    """Isolation of one layer: its evidence and what the judge decided of it."""

    evidence: LayerEvidence
    verdict: LayerVerdict

    @property
    def layer(self) -> int:
        return self.evidence.layer

    @property
    def introduces(self) -> bool:
        return self.verdict.introduces

    @property
    def block(self) -> str | None:
        return self.verdict.block

    def accumulation(self) -> dict[str, float | None]:
        """Carried in vs carried out (RMSE at the layer's input and output in the full run) and the
        growth through the layer, beside the calibration run's own (a correct run's accumulation)."""
        ev = self.evidence
        e_in, e_out = _rmse(ev.carried_in), _rmse(ev.total)
        n_in, n_out = _rmse(ev.noise_in), _rmse(ev.noise_out)
        return {"carried_in_rmse": e_in, "carried_out_rmse": e_out, "growth": _growth(e_in, e_out),
                "calibration_in_rmse": n_in, "calibration_out_rmse": n_out, "calibration_growth": _growth(n_in, n_out)}

    def block_result(self, key: CheckpointKey) -> BlockResult | None:
        """The block ending at ``key``, as replayed and judged (None: not judged apart)."""
        ev, v = self.evidence, self.verdict
        part = v.part_at(key)
        if part == "attention" and ev.attention is not None and v.attention is not None:
            return BlockResult("attention", "reference", v.attention, ev.attention.error)
        if part == "mlp" and v.mlp is not None:
            return BlockResult("mlp", v.mlp_input or "reference", v.mlp, (ev.mlp or ev.whole).error)
        if part == "whole":
            return BlockResult("layer", "reference", v.whole, ev.whole.error)
        return None

    @classmethod
    def from_dict(cls, data: Mapping[str, JsonValue]) -> LayerResult:
        """An isolation entry read back (:meth:`to_dict`'s shape): each block's judgement and its
        two error figures, the carried-in and total errors, the calibration run's RMSE in and out."""
        layer = int(str(data["layer"]))

        def judged(part: str) -> tuple[Judgement, ComparisonResult] | None:
            entry = data.get(part)
            if not isinstance(entry, Mapping) or "judged_by" not in entry:
                return None
            return judgement_from(entry), brief_comparison(entry) or _no_comparison()

        def evidence(block: str, checkpoint: str, found: tuple[Judgement, ComparisonResult] | None,
                     input_: str = "reference") -> BlockEvidence | None:
            return None if found is None else BlockEvidence(block, CheckpointKey(checkpoint, layer), found[1], None,
                                                            math.nan, input_)  # type: ignore[arg-type]

        attention, mlp, whole = judged("attention"), judged("mlp"), judged("layer_replay")
        mlp_entry = data.get("mlp")
        mlp_input = str(mlp_entry["input"]) if isinstance(mlp_entry, Mapping) and mlp_entry.get("input") else None
        # an entry written through the records' API names the blocks that introduce error and its two
        # figures, without the blocks' judgements: each named block reads as failing its isolation
        blocks, block = data.get("blocks"), data.get("block")
        named = [str(b) for b in blocks] if isinstance(blocks, list) else ([str(block)] if block else [])
        introduced = ComparisonResult(True, None, _NO_TOLERANCE, max_abs_error=as_float(data.get("introduced_error")))
        failing = (Judgement.from_dict({"passed": False, "judged_by": "isolation"}), introduced)
        attention = attention or (failing if "attention" in named else None)
        mlp = mlp or (failing if "mlp" in named else None)
        # no whole-layer replay stored: none failed (the entry names every block that introduces error)
        whole = whole or (failing if "layer" in named else
                          (Judgement.from_dict({"passed": True, "judged_by": "isolation"}), introduced))
        mlp_input = mlp_input or ("reference" if "layer" in named else None)
        carried = brief_comparison(data.get("carried_in"))
        if carried is None and data.get("propagated_error") is not None:
            carried = ComparisonResult(True, None, _NO_TOLERANCE, max_abs_error=as_float(data.get("propagated_error")))
        noise_in, noise_out = as_float(data.get("calibration_in_rmse")), as_float(data.get("calibration_out_rmse"))
        replay_s, note = as_float(data.get("replay_s")), data.get("mlp_note")
        whole_ev = evidence("layer", "post_mlp", whole)
        assert whole_ev is not None
        ev = LayerEvidence(
            layer=layer, carried_in=carried or _no_comparison(),
            total=brief_comparison(data.get("total")), attention=evidence("attention", "post_attention", attention),
            mlp=evidence("mlp", "post_mlp", mlp, mlp_input or "reference"), whole=whole_ev,
            noise_in=None if noise_in is None else ComparisonResult(True, None, _NO_TOLERANCE, rmse=noise_in),
            noise_out=None if noise_out is None else ComparisonResult(True, None, _NO_TOLERANCE, rmse=noise_out),
            replay_s=0.0 if replay_s is None else replay_s, mlp_note=note if isinstance(note, str) else None)
        verdict = LayerVerdict(layer, None if attention is None else attention[0], None if mlp is None else mlp[0],
                               whole[0], mlp_input)
        return cls(ev, verdict)

    def to_dict(self) -> JsonObject:
        ev, v = self.evidence, self.verdict

        def block(j: Judgement | None, b: BlockEvidence | None, input_: str | None) -> JsonObject | None:
            if j is None or b is None:
                return None
            return {"input": input_, **j.to_dict(), **(brief(b.error) or {})}

        return json_safe({
            "layer": ev.layer,
            "introduces_error": v.introduces,
            "block": v.block,
            "blocks": v.blocks,
            "attention": block(v.attention, ev.attention, "reference"),
            "mlp": block(v.mlp, ev.mlp if ev.mlp is not None else ev.whole, v.mlp_input),
            "mlp_note": ev.mlp_note,
            "layer_replay": block(v.whole, ev.whole, "reference"),
            "carried_in": brief(ev.carried_in),
            "total": brief(ev.total),
            "replay_s": ev.replay_s,
            **self.accumulation(),
        })


@dataclass(frozen=True)
class ErrorSource:
    """Where a failed validation's error comes from (the judge's ``error_source``): ``kind`` is
    ``layer``, ``embedding``, ``head``, ``accumulation``, ``decode``, ``kv_cache`` or ``served`` (a
    served model, which gives out no hidden state to place it deeper); ``layer``,
    ``block`` and ``step`` place it; ``confirmed`` says whether isolation confirmed it."""

    kind: str
    layer: int | None = None
    block: str | None = None
    step: int | None = None
    confirmed: bool = True
    detail: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, JsonValue]) -> ErrorSource:
        """The judge's ``error_source`` object (as stored) as a record."""
        layer, block, step, detail = data.get("layer"), data.get("block"), data.get("step"), data.get("detail")
        return cls(kind=str(data.get("kind")), layer=layer if isinstance(layer, int) else None,
                   block=block if isinstance(block, str) else None, step=step if isinstance(step, int) else None,
                   confirmed=data.get("confirmed", True) is not False, detail=detail if isinstance(detail, str) else None)

    def text(self) -> str:
        """In words: ``layer 1 (attention)``, ``the embedding``, ``the final norm / head``,
        ``accumulation (first beyond its bound at layer 3)``, ``layer 1 (attention) at decode step
        1``, ``the KV cache of layer 1 after step 1``, with ``(not confirmed by isolation)`` where
        isolation did not confirm it. Every view prints this."""
        at_layer = f"layer {self.layer}" + (f" ({self.block})" if self.block else "")
        where = {"layer": at_layer, "embedding": "the embedding", "head": "the final norm / head",
                 "accumulation": f"accumulation (first beyond its bound at layer {self.layer})",
                 "decode": f"{at_layer} at decode step {self.step}" if self.layer is not None else f"decode step {self.step}",
                 "kv_cache": (f"the KV cache of layer {self.layer}" if self.layer is not None else "the KV cache")
                             + (f" after step {self.step}" if self.step is not None else ""),
                 "served": "the served model" + (f" at decode step {self.step}" if self.step else "")
                           + " (it gives out only token log-probabilities)"}.get(self.kind, self.kind)
        return where + ("" if self.confirmed or self.kind == "served" else " (not confirmed by isolation)")


@dataclass(frozen=True)
class Introducer:
    """A layer that introduces error on its own: at ``step`` (0: the prefill), in ``blocks``."""

    layer: int | None
    step: int | None
    blocks: tuple[str, ...]


@dataclass
class ValidationResult:
    """Everything one validation measured and decided: per-checkpoint results in model order, the
    verdict, the first divergence, isolation per layer, oracle/noise-floor reports and performance."""

    session_id: str
    model_path: str
    reference_backend: str
    alternative_backend: str
    reference_dtype: str
    alternative_dtype: str
    results: list[CheckpointResult]
    isolation: list[LayerResult] | None = None
    isolation_note: str | None = None
    error_source: JsonObject | None = None
    oracle: JsonObject | None = None
    noise_floor: JsonObject | None = None
    performance: JsonObject = field(default_factory=dict)
    recordings: str | None = None
    #: the op-level drill-down, one entry per drilled layer (None: not requested)
    drilldown: list[LayerDrilldown] | None = None
    #: the lower precision a correct run at which errs as this run does (the judge's; None: none)
    consistent_with: str | None = None
    #: the precision stage's note: which lower precisions were measured, which skipped and why
    precision_diagnosis: JsonObject | None = None
    #: every node output of an ONNX file compared in topological order (``--mark-all``; None: not asked)
    mark_all: JsonObject | None = None
    #: decode steps (None: the prefill only): {steps, tokens, tokens_from, kv_cache, seconds_per_step}
    decode: JsonObject | None = None
    #: the options the alternative backend was built with (``--backend-option``, ``alternative_options``)
    alternative_options: JsonObject = field(default_factory=dict)
    #: the engine's own numerical evidence beside the judgement (its ``tool``, e.g. a .pte engine's
    #: Inspector: its gap per place in the model, or why it failed); None: the engine gave none
    inspector: JsonObject | None = None

    @classmethod
    def assemble(cls, evidence: Evidence, verdict: Verdict, **info: Any) -> ValidationResult:
        """The record of ``evidence`` as ``verdict`` judged it (``info``: the session's fields)."""
        layers = None if verdict.layers is None or evidence.layers is None else [
            LayerResult(ev, verdict.layers[ev.layer]) for ev in evidence.layers]
        by_layer = {lr.layer: lr for lr in layers or []}
        results = [checkpoint_result(ev, verdict.of(ev.key, ev.step), by_layer.get(ev.key.layer)
                                     if ev.key.layer is not None and not ev.step else None)
                   for ev in evidence.checkpoints]
        decode = info.pop("decode", None)
        if decode is not None and verdict.kv:  # each KV-cache row with its judgement
            decode = {**decode, "kv_cache": [_judged_kv(row, verdict) for row in decode.get("kv_cache", [])]}
        if decode is not None and "token_metrics" in decode:  # each pass's token metrics with their judgement
            decode = {**decode, "token_metrics": [_judged_tokens(row, verdict) for row in decode["token_metrics"]],
                      "first_divergent_token": verdict.first_divergent_token}
        if decode is not None and verdict.decode_layers and evidence.decode_replay is not None:
            decode = {**decode, "isolation": _decode_isolation(evidence, verdict)}
        return cls(results=results, isolation=layers, isolation_note=evidence.isolation_note,
                   error_source=verdict.error_source, consistent_with=verdict.consistent_with,
                   precision_diagnosis=evidence.precision_note, mark_all=evidence.mark_all, decode=decode,
                   **info)

    @classmethod
    def load(cls, store: DatabaseLike, session_id: str) -> ValidationResult:
        """The stored session ``session_id`` read back as the result that was stored: its session
        row's ``results`` (:meth:`summary`) and its checkpoint rows (:meth:`CheckpointResult.to_row`).
        ``store``: a :class:`~debug_framework.storage.database.Database` or a path. DatabaseError
        (DF003) when there is no such session."""
        from ...storage.database import open_database

        database = open_database(store)
        row = database.sessions.get(session_id)
        if row is None:
            raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                hint="list sessions with session_report --list")
        return cls.from_stored(row, database.checkpoints.for_session(session_id))

    @classmethod
    def from_stored(cls, session: Mapping[str, JsonValue], rows: Sequence[Mapping[str, JsonValue]]) -> ValidationResult:
        """The result of a stored session row and its checkpoint rows (model order): the inverse of
        what the CLI stores (``results`` = :meth:`summary`, each row :meth:`CheckpointResult.to_row`).
        A session that stored no summary (it ended in error, or was written through the records'
        API) reads back with its rows and nothing else."""
        stored = session.get("results")
        summary: Mapping[str, JsonValue] = stored if isinstance(stored, Mapping) else {}

        def obj(key: str) -> JsonObject | None:
            value = summary.get(key)
            return dict(value) if isinstance(value, Mapping) else None

        def text(mapping: Mapping[str, JsonValue], key: str) -> str:
            value = mapping.get(key)
            return "" if value is None else str(value)

        iso, drill = summary.get("isolation"), summary.get("drilldown")
        note, consistent, recordings = summary.get("isolation_note"), summary.get("consistent_with"), summary.get("recordings")
        return cls(
            session_id=text(session, "session_id"), model_path=text(session, "model_path"),
            reference_backend=text(session, "reference_backend"), alternative_backend=text(session, "alternative_backend"),
            reference_dtype=text(summary, "reference_dtype"), alternative_dtype=text(summary, "alternative_dtype"),
            results=[CheckpointResult.from_row(r) for r in rows],
            isolation=[LayerResult.from_dict(d) for d in iso if isinstance(d, Mapping)] if isinstance(iso, list) else None,
            isolation_note=note if isinstance(note, str) else None,
            error_source=obj("error_source"), oracle=obj("oracle"), noise_floor=obj("noise_floor"),
            performance=obj("performance") or {}, recordings=recordings if isinstance(recordings, str) else None,
            drilldown=[LayerDrilldown.from_dict(dict(d)) for d in drill if isinstance(d, Mapping)]
            if isinstance(drill, list) else None,
            consistent_with=consistent if isinstance(consistent, str) else None,
            precision_diagnosis=obj("precision_diagnosis"), mark_all=obj("mark_all"), decode=obj("decode"),
            alternative_options=obj("alternative_options") or {}, inspector=obj("inspector"))

    @classmethod
    def from_dict(cls, doc: Mapping[str, JsonValue]) -> ValidationResult:
        """The inverse of :meth:`to_dict` (the CLI's ``--json``): the result it was written from."""
        rows = doc.get("results")
        return cls.from_stored({**doc, "results": dict(doc)},
                               [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else [])

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"

    @property
    def first_divergence(self) -> CheckpointResult | None:
        """The earliest checkpoint (model order) that failed (a stored row with no verdict did not)."""
        return next((r for r in self.results if r.state is False), None)

    @property
    def source(self) -> ErrorSource | None:
        """:attr:`error_source` as a record (None: the validation passed, or named no source)."""
        return None if self.error_source is None else ErrorSource.from_dict(self.error_source)

    @property
    def decoded(self) -> DecodeRecord | None:
        """:attr:`decode` as a typed record (None: the prefill only)."""
        return None if self.decode is None else DecodeRecord.from_dict(self.decode)

    @property
    def introducing_layers(self) -> list[int]:
        """Layers that introduce error on their own (isolation), even after an earlier divergence."""
        return [lr.layer for lr in self.isolation or [] if lr.introduces]

    def introducing(self) -> list[Introducer] | None:
        """The layers that introduce error on their own, from the prefill's isolation and from the
        replays at the first divergent decode step, in that order (``step`` 0: the prefill); None
        where no isolation ran at all. The one list every view shows."""
        found: list[Introducer] | None = None
        if self.isolation is not None:
            found = [Introducer(lr.layer, 0, tuple(lr.verdict.blocks)) for lr in self.isolation if lr.introduces]
        iso = None if self.decoded is None else self.decoded.isolation
        if iso is not None and iso.layers:
            found = (found or []) + [Introducer(r.layer, iso.step, (r.block,)) for r in iso.layers if r.introduces]
        return found

    def sensitivity(self) -> JsonObject | None:
        """What this run's bounds can see: ``{dtype, checkpoints, finest: {id, change}, coarsest:
        {id, change}}`` over the checkpoints whose bound is in the output's units
        (:attr:`CheckpointResult.detectable_change`): a relative change of the output below
        ``coarsest.change`` may pass unseen at ``coarsest.id``; None where no checkpoint has one."""
        seen = [(r, change) for r in self.results if (change := r.detectable_change) is not None]  # each once
        if not seen:
            return None
        finest, coarsest = min(seen, key=lambda t: t[1]), max(seen, key=lambda t: t[1])
        return {"dtype": self.alternative_dtype, "checkpoints": len(seen),
                "finest": {"id": finest[0].id, "change": finest[1]},
                "coarsest": {"id": coarsest[0].id, "change": coarsest[1]}}

    def summary(self) -> JsonObject:
        """What the session row keeps (``results``): :meth:`to_dict` without the per-checkpoint list."""
        first = self.first_divergence
        return json_safe({
            "verdict": self.verdict,
            "checkpoints": len(self.results),
            "failed": sum(not r.passed for r in self.results),
            "first_divergence": None if first is None else divergence_ref(first.to_dict()),
            "introducing_layers": self.introducing_layers if self.isolation is not None else None,
            "error_source": self.error_source,
            "consistent_with": self.consistent_with,
            "detectable_change": self.sensitivity(),
            "precision_diagnosis": self.precision_diagnosis,
            "mark_all": self.mark_all,
            "decode": self.decode,
            "isolation": None if self.isolation is None else [lr.to_dict() for lr in self.isolation],
            "isolation_note": self.isolation_note,
            "oracle": self.oracle,
            "noise_floor": self.noise_floor,
            "performance": self.performance,
            "recordings": self.recordings,
            "drilldown": None if self.drilldown is None else [d.to_dict() for d in self.drilldown],
            "reference_dtype": self.reference_dtype,
            "alternative_dtype": self.alternative_dtype,
            "alternative_options": self.alternative_options,
            "inspector": self.inspector,
        })

    def to_dict(self) -> JsonObject:
        """JSON-ready (non-finite floats as "NaN"/"Infinity"/"-Infinity" strings)."""
        return json_safe({
            "session_id": self.session_id,
            "model_path": self.model_path,
            "reference_backend": self.reference_backend,
            "alternative_backend": self.alternative_backend,
            **self.summary(),
            "results": [r.to_dict() for r in self.results],
        })


def _decode_isolation(evidence: Evidence, verdict: Verdict) -> JsonObject:
    """``{step, layers: [{layer, checkpoint, introduces, rmse, judged_by, bound, margin, reason}]}``:
    each layer failing at the first divergent decode step, replayed there on the reference's input
    (``introduces``: beyond its bound; else the error is carried in)."""
    assert evidence.decode_replay is not None
    step, blocks = evidence.decode_replay
    rows = []
    for layer, j in sorted(verdict.decode_layers.items()):
        block = blocks[layer]
        rows.append({"layer": layer, "checkpoint": str(block.key), "introduces": not j.passed,
                     "rmse": block.error.rmse, "judged_by": j.judged_by, "bound": j.bound, "margin": j.margin,
                     "reason": j.reason})
    return {"step": step, "layers": rows}


def _judged_kv(row: Mapping[str, JsonValue], verdict: Verdict) -> JsonObject:
    """A KV-cache row (step, layer, k, v) with each part's judgement (passed, judged_by, bound, margin)."""
    out = dict(row)
    for part in ("k", "v"):
        j = verdict.kv.get((int(row["step"]), int(row["layer"]), part))
        if j is not None and isinstance(row.get(part), Mapping):
            out[part] = {**row[part], "passed": j.passed, "judged_by": j.judged_by, "bound": j.bound,
                         "margin": j.margin}
    out["passed"] = all(out[p].get("passed", True) for p in ("k", "v") if isinstance(out.get(p), Mapping))
    return out


def _judged_tokens(row: Mapping[str, JsonValue], verdict: Verdict) -> JsonObject:
    """A token_metrics row (one pass) with its judgement (passed, judged_by, bound: the mean KL's,
    margin, reason; all None where it was not calibrated, so not judged) and ``failed_by``: the
    metrics that failed the pass, ``"top1"`` (more top-1 tokens flipped beyond noise than a
    correct run flips) and/or ``"kl_divergence"`` (the mean KL beyond ``bound``); [] where it passed."""
    j = verdict.tokens.get(int(row["step"]))
    failed_by: list[JsonValue] = []
    if j is not None and not j.passed:
        if (j.reason or "").startswith(FLIPS_REASON):
            failed_by.append("top1")
        if j.rule is not None and not j.rule.passed:
            failed_by.append("kl_divergence")
    return {**row, "passed": None if j is None else j.passed, "judged_by": None if j is None else j.judged_by,
            "bound": None if j is None else j.bound, "margin": None if j is None else j.margin,
            "reason": None if j is None else j.reason, "failed_by": failed_by}


def divergence_ref(row: Mapping[str, JsonValue]) -> JsonObject:
    """A failing checkpoint, by reference: its id and structured fields, the rule, margin and reason
    (its metrics are in its own entry of ``results``)."""
    return {k: row.get(k) for k in ("id", "checkpoint", "layer", "step", "module", "judged_by", "bound", "margin",
                                    "reason", "max_abs_error")}


def checkpoint_result(ev: CheckpointEvidence, judgement: Judgement, layer: LayerResult | None) -> CheckpointResult:
    """One checkpoint's evidence and judgement as its result record."""
    return CheckpointResult(
        key=ev.key, comparison=ev.comparison, judgement=judgement, noise=ev.noise,
        introduced=None if layer is None else layer.block_result(ev.key),
        carried_in=None if layer is None else layer.evidence.carried_in,
        run_to_run=ev.run_to_run, accumulation=None if layer is None else layer.accumulation(),
        step=ev.step, module=ev.module,
        reference_rms=None if math.isnan(ev.reference_rms) else ev.reference_rms,
    )
