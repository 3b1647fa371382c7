"""The stages of one validation, each a small class over a shared :class:`RunContext`.

The engine (:mod:`debug_framework.services.validation_engine`) runs them in order and alone owns
progress, timing and "persist the checkpoint rows after each stage". A stage only does its work:

====================  ===========================================================================
``load``              the model (its digest must still match the session's), the saved inputs, the plan
``prepare``           both backends built and prepared; whether per-layer isolation can run
``reference``         the reference backend's forward pass (wall time, per-layer time, peak memory)
``alternative``       the same for the alternative backend
``calibration``       a trusted implementation at the alternative's precision: the noise bounds
``compare``           every enabled checkpoint compared (:func:`debug_framework.comparison.compare`)
                      and judged by its calibrated bound (or its explicit tolerance)
``isolation``         each layer of the alternative (and of the calibration) replayed on the
                      reference's input to it; a layer beyond its replay bound introduces error
``oracle``            the ratio rule against a float64 ``python_reference``
``noise floor``       each backend run again; run-to-run differences reported apart
``drill-down``        inside each diverging layer, the operator that introduces the error
                      (:mod:`.drill_stage`, with ``drill_down: true``)
``record``            the worst checkpoints' tensors kept in the content-addressed tensor store
``store``             the verdict and summary written to the session
====================  ===========================================================================

Adding a step to validation (a drill-down, a plugin swap-in) means writing one :class:`Stage`
and putting it in :data:`DEFAULT_STAGES` (or passing a list to ``ValidationEngine(stages=...)``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from ...backends.base import Backend, LayerReplayBackend, layer_replay_support
from ...capture.keys import Capture, CheckpointKey, all_checkpoints
from ...comparison import ComparisonResult, RatioRule, compare, error_metric
from ...errors import ModelLoadingError, ValidationError
from ...measure import PeakMemory, Timer, layer_timer
from .calibration import (
    calibration_backend,
    judge_by_noise,
    noise_at,
    replay_noise,
    scale_floor,
    tolerance_margin,
)
from .context import RunContext, Stage, call_backend
from .drill_stage import DrillDownStage
from .plan import ValidationPlan
from .results import CheckpointOutcome, LayerIsolation, ValidationResult

if TYPE_CHECKING:
    from ...modelio import ModelInputs

__all__ = [
    "RunContext",
    "Stage",
    "call_backend",
    "LoadStage",
    "PrepareStage",
    "RunBackendStage",
    "CalibrationStage",
    "CompareStage",
    "IsolationStage",
    "OracleStage",
    "NoiseFloorStage",
    "RecordStage",
    "StoreStage",
    "DrillDownStage",
    "DEFAULT_STAGES",
]


# ------------------------------------------------------------------------------------------------
# load and prepare
# ------------------------------------------------------------------------------------------------


class LoadStage(Stage):
    """The model (its digest must still match the session's), the saved inputs and the plan."""

    name = "load"
    timing_key = "model_load_s"

    def run(self, ctx: RunContext) -> None:
        from ...modelio import ModelInputs, load_model

        session = ctx.session
        model = load_model(session.model_path)
        if session.weights_digest and model.digest != session.weights_digest:
            raise ModelLoadingError(
                "the weights changed since the session was created (digest mismatch)",
                file=session.model_path, hint="create a new session for the new weights",
            )
        if not session.inputs_ref:
            raise ValidationError("the session has no saved inputs", session=session.session_id)
        ctx.inputs = ModelInputs.load(session.inputs_ref)
        ctx.model = model
        ctx.plan = ValidationPlan.resolve(session.config, model.num_layers)


class PrepareStage(Stage):
    """Both backends built and prepared; isolation decided (required but impossible is DF005)."""

    name = "prepare"

    def run(self, ctx: RunContext) -> None:
        from ...backends import get_backend

        plan, session = ctx.plan, ctx.session
        cfg = plan.config
        ctx.reference = get_backend(session.reference_backend, **cfg["reference_options"])
        ctx.alternative = get_backend(session.alternative_backend, **cfg["alternative_options"])
        for side, backend, dtype, device in (
            ("reference", ctx.reference, plan.reference_dtype, cfg["reference_device"]),
            ("alternative", ctx.alternative, plan.alternative_dtype, cfg["device"]),
        ):
            with Timer() as t:
                call_backend(backend, "prepare()", lambda b=backend, d=dtype, dev=device: b.prepare(ctx.model, d, dev))
            ctx.prepare_s[side] = t.seconds
        isolate = cfg["isolate"]
        if not isolate:
            ctx.isolating, ctx.isolation_note = False, "isolation not requested"
            return
        ok, why = _replay_support(ctx.reference, ctx.alternative)
        if isolate is True and not ok:
            raise ValidationError(f"isolation was requested but {why}", session=session.session_id,
                                  hint="set isolate to 'auto' or false, or give the backend a run_layer")
        ctx.isolating, ctx.isolation_note = ok, (None if ok else why)


def _replay_support(reference: Backend, alternative: Backend) -> tuple[bool, str]:
    for side, backend in (("reference", reference), ("alternative", alternative)):
        ok, why = layer_replay_support(backend)
        if not ok:
            return False, f"the {side} backend {backend.name!r} {why}"
    return True, ""


# ------------------------------------------------------------------------------------------------
# running the backends
# ------------------------------------------------------------------------------------------------


def run_measured(backend: Backend, dtype: str, device: str, inputs: ModelInputs, taps: list[CheckpointKey], *,
                 layer_inputs: bool, plan: ValidationPlan, prepare_s: float) -> tuple[Capture, dict[str, Any]]:
    """One forward pass of a prepared backend with the plan's profiling: ``(capture, stats)``."""
    mem = PeakMemory(device) if plan.memory_profiling else contextlib.nullcontext()
    with layer_timer(backend, plan.per_layer_timing) as timing, Timer() as wall, mem:
        cap = call_backend(backend, "run()", lambda: backend.run(inputs, taps, capture_layer_inputs=layer_inputs))
    stats: dict[str, Any] = {"backend": backend.name, "dtype": dtype, "device": device, "prepare_s": prepare_s,
                             "forward_s": float(cap.elapsed_s), "wall_s": wall.seconds}
    if plan.per_layer_timing:
        stats["per_layer_s"] = timing.per_layer_s
        stats["per_layer_method"] = timing.method
        if timing.note:
            stats["per_layer_note"] = timing.note
    if isinstance(mem, PeakMemory):
        stats["memory"] = mem.result.to_dict()
    return cap, stats


class RunBackendStage(Stage):
    """One side's forward pass. Isolation needs every layer's checkpoints (and layer inputs) from
    both runs; only the enabled checkpoints are reported."""

    def __init__(self, side: str) -> None:
        if side not in ("reference", "alternative"):
            raise ValueError(f"side must be 'reference' or 'alternative', got {side!r}")
        self.side = side

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.side

    def run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        if self.side == "reference":
            backend, dtype, device = ctx.reference, plan.reference_dtype, plan.config["reference_device"]
        else:
            backend, dtype, device = ctx.alternative, plan.alternative_dtype, plan.config["device"]
        taps = all_checkpoints(plan.num_layers) if ctx.isolating else list(plan.keys)
        drill = self.side == "reference" and bool(plan.config["drill_down"])  # the drill-down's layer inputs
        ctx.captures[self.side], ctx.performance[self.side] = run_measured(
            backend, dtype, device, ctx.inputs, taps, layer_inputs=ctx.isolating or drill, plan=plan,
            prepare_s=ctx.prepare_s[self.side])


# ------------------------------------------------------------------------------------------------
# judging
# ------------------------------------------------------------------------------------------------


def _compare_key(ref: Capture, alt: Capture, key: CheckpointKey, plan: ValidationPlan) -> ComparisonResult:
    tol = plan.tolerance(key)
    for side, cap in (("alternative", alt), ("reference", ref)):
        if key not in cap:
            return ComparisonResult(passed=False, reason=f"the {side} backend produced no tensor for {key}",
                                    tolerance=tol, name=str(key))
    return compare(ref[key], alt[key], tolerance=tol, check_dtype=False, name=str(key))


class CalibrationStage(Stage):
    """The trusted implementation (``calibration_backend``; default ``torch_reference``) run at the
    alternative's dtype on the same inputs: its error against the reference is each checkpoint's
    noise (:mod:`.calibration`). Also the oracle mode's baseline when the reference is the oracle."""

    name = "calibration"
    timing_key = "calibration_s"

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config["calibrate"] or config["oracle"])

    def ready(self, ctx: RunContext) -> bool:
        """Some checkpoint is calibrated, or oracle mode needs a baseline (the reference is the oracle)."""
        plan = ctx.plan
        oracle_baseline = bool(plan.config["oracle"]) and OracleStage.reference_is_oracle(ctx)
        return oracle_baseline or any(plan.calibrated(k) for k in plan.keys)

    def run(self, ctx: RunContext) -> None:
        plan, dtype = ctx.plan, ctx.plan.alternative_dtype
        backend = calibration_backend(plan, ctx.session.alternative_backend)
        with Timer() as t:
            call_backend(backend, "prepare()", lambda: backend.prepare(ctx.model, dtype, "cpu"))
        taps = all_checkpoints(plan.num_layers) if ctx.isolating else list(plan.keys)
        ctx.captures["calibration"], ctx.performance["calibration"] = run_measured(
            backend, dtype, "cpu", ctx.inputs, taps, layer_inputs=False, plan=plan, prepare_s=t.seconds)
        ctx.calibrator = backend


class CompareStage(Stage):
    """Every enabled checkpoint compared, in model order, and judged by its calibrated bound
    (``noise_margin x noise + floor``) or, where ``precision_thresholds`` sets one or calibration
    is off, by its tolerance."""

    name = "compare"
    timing_key = "comparison_s"
    persists_rows = True  # rows go in now, in model order: nothing compared is lost if a later stage fails

    def run(self, ctx: RunContext) -> None:
        ref, alt, calib = ctx.reference_capture, ctx.alternative_capture, ctx.captures.get("calibration")
        for key in ctx.plan.keys:
            comp = _compare_key(ref, alt, key, ctx.plan)
            o = CheckpointOutcome(key=key, comparison=comp, passed=comp.passed, reason=comp.reason,
                                  noise=noise_at(key, ref, calib))
            if o.noise is not None and ctx.plan.calibrated(key) and key in alt:
                o.judgement = judge_by_noise(ctx.plan, ref[key], o.noise, comp)
                o.passed, o.reason = o.judgement.passed, o.judgement.reason
            elif key in ref and key in alt and comp.tolerance.pass_rule == "allclose":
                o.tolerance_margin = tolerance_margin(ref[key], alt[key], comp.tolerance)
            ctx.outcomes.append(o)


class IsolationStage(Stage):
    """Introduced vs carried-in error per layer: the alternative replays layer *i* on the
    reference's input to it; that replay's error is what the layer introduces, the error at the
    layer's input in the full run is what it carries in."""

    name = "isolation"
    timing_key = "isolation_s"
    persists_rows = True

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config["isolate"])

    def ready(self, ctx: RunContext) -> bool:
        return ctx.isolating  # "auto" with a backend that cannot replay a layer: nothing to do

    def run(self, ctx: RunContext) -> None:
        compared = {o.key: o.comparison for o in ctx.outcomes}  # the compare stage's, reused as "total"
        noises = {o.key: o.noise for o in ctx.outcomes if o.noise is not None}  # and its calibration noise
        ctx.isolation = [self._layer(ctx, i, compared, noises) for i in ctx.plan.layer_range]
        by_layer = {iso.layer: iso for iso in ctx.isolation}
        for o in ctx.outcomes:
            iso = by_layer.get(o.key.layer) if o.key.layer is not None else None
            if iso is not None:
                attn = o.key.name == "post_attention"
                o.carried_in, o.accumulation = iso.carried_in, iso.accumulation()
                o.introduced = iso.introduced_attention if attn else iso.introduced_mlp
                o.introduced_judgement = iso.attention_judgement if attn else iso.mlp_judgement
                if o.passed and o.fails_by_isolation:  # the verdict agrees with isolation: the layer is named
                    o.passed, o.reason = False, f"layer {o.key.layer} introduces error on its own: " + (
                        o.introduced_judgement.reason if o.introduced_judgement is not None and
                        o.introduced_judgement.reason else "its replay fails its tolerance")
        ctx.isolation_note = None

    @staticmethod
    def _layer(ctx: RunContext, i: int, compared: Mapping[CheckpointKey, ComparisonResult],
               noises: dict[CheckpointKey, ComparisonResult | None]) -> LayerIsolation:
        plan, ref_cap, alt_cap = ctx.plan, ctx.reference_capture, ctx.alternative_capture
        ref_in = ref_cap.layer_inputs.get(i)
        if ref_in is None:
            raise ValidationError(f"the reference backend did not record the input of layer {i}",
                                  hint="its run() must fill Capture.layer_inputs when capture_layer_inputs=True")
        k_in = CheckpointKey("post_embedding") if i == 0 else CheckpointKey("post_mlp", i - 1)
        alt_in = alt_cap.layer_inputs.get(i)
        if alt_in is None:  # the layer's input is the previous layer's output
            alt_in = alt_cap.tensors.get(k_in)
        if alt_in is None:
            carried = ComparisonResult(passed=False, reason=f"the alternative's input to layer {i} is unknown",
                                       tolerance=plan.tolerance(k_in), name=f"layer {i} input")
        else:
            carried = compare(ref_in, alt_in, tolerance=plan.tolerance(k_in), check_dtype=False,
                              name=f"layer {i} input")
        alternative = cast(LayerReplayBackend, ctx.alternative)  # PrepareStage checked layer_replay_support
        replay = call_backend(alternative, f"run_layer({i})", lambda: alternative.run_layer(i, ref_in, ctx.inputs))
        k_attn, k_mlp = CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)
        intro_attn = None
        if k_attn in replay and k_attn in ref_cap:
            intro_attn = compare(ref_cap[k_attn], replay[k_attn], tolerance=plan.tolerance(k_attn),
                                 check_dtype=False, name=f"{k_attn} replayed")
        if k_mlp in replay:
            intro_mlp = compare(ref_cap[k_mlp], replay[k_mlp], tolerance=plan.tolerance(k_mlp), check_dtype=False,
                                name=f"{k_mlp} replayed")
        else:
            intro_mlp = ComparisonResult(passed=False, reason=f"run_layer({i}) returned no post_mlp tensor",
                                         tolerance=plan.tolerance(k_mlp), name=f"{k_mlp} replayed")
        total = compared.get(k_mlp)
        if total is None and k_mlp in alt_cap and k_mlp in ref_cap:  # post_mlp:i is not an enabled checkpoint
            total = _compare_key(ref_cap, alt_cap, k_mlp, plan)
        calib, cal_replay = ctx.captures.get("calibration"), None
        for k in (k_in, k_mlp):  # each checkpoint's noise measured once (layer i's input is layer i-1's output)
            if k not in noises:
                noises[k] = noise_at(k, ref_cap, calib)
        if ctx.calibrator is not None and layer_replay_support(ctx.calibrator)[0] and plan.config["calibrate"]:
            calibrator = cast(LayerReplayBackend, ctx.calibrator)
            cal_replay = call_backend(calibrator, f"run_layer({i})", lambda: calibrator.run_layer(i, ref_in, ctx.inputs))
        return LayerIsolation(layer=i, carried_in=carried, introduced_attention=intro_attn, introduced_mlp=intro_mlp,
                              total=total, alternative_replay_s=float(replay.elapsed_s),
                              attention_judgement=replay_noise(plan, k_attn, ref_cap, cal_replay, intro_attn),
                              mlp_judgement=replay_noise(plan, k_mlp, ref_cap, cal_replay, intro_mlp),
                              noise_in=noises[k_in], noise_out=noises[k_mlp])


class OracleStage(Stage):
    """Judge each checkpoint by the ratio rule ``err(alt, oracle) <= m * err(baseline, oracle) + floor``
    against ``python_reference`` in float64 (the reference itself when it already is that). The
    baseline is the reference, or, when the reference is the oracle, the calibration run (the
    trusted implementation at the alternative's precision). The floor is ``oracle_floor`` when
    given, else ``floor_eps x eps(dtype) x RMS(oracle tensor)``."""

    name = "oracle"
    timing_key = "oracle_s"
    persists_rows = True

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config["oracle"])

    def run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        oracle_cap = self._oracle_capture(ctx)
        cfg = plan.config
        fixed_floor = cfg["oracle_floor"]
        base_name, base_cap = "the reference", ctx.reference_capture
        if oracle_cap is ctx.reference_capture:  # the reference is the oracle: judge against the trusted run
            base_name, base_cap = f"a correct {plan.alternative_dtype} run", ctx.captures["calibration"]
        alt_cap = ctx.alternative_capture
        failed = []
        for o in ctx.outcomes:
            k = o.key
            if k not in oracle_cap or k not in base_cap or k not in alt_cap:
                o.passed, o.reason = False, o.reason or f"no tensor for {k} from one of the three runs"
                failed.append(str(k))
                continue
            floor = float(fixed_floor) if fixed_floor is not None else scale_floor(plan, oracle_cap[k])
            rule = RatioRule(float(cfg["oracle_multiplier"]), floor, str(cfg["oracle_metric"]))
            verdict = rule.verdict(compare(oracle_cap[k], base_cap[k], check_dtype=False),
                                   compare(oracle_cap[k], alt_cap[k], check_dtype=False),
                                   oracle="the float64 oracle", baseline_name=base_name)
            o.oracle = verdict.judgement
            o.passed = verdict.passed and not o.fails_by_isolation
            o.reason = (f"oracle ratio rule: {verdict.reason}" if not verdict.passed
                        else None if o.passed else f"layer {k.layer} introduces error on its own (isolation)")
            if not o.passed:
                failed.append(str(k))
        ctx.oracle_report = {
            "oracle_backend": "python_reference", "oracle_dtype": "float64", "metric": str(cfg["oracle_metric"]),
            "multiplier": float(cfg["oracle_multiplier"]), "baseline": base_name, "failed": failed,
            "floor": fixed_floor if fixed_floor is not None else f"{cfg['floor_eps']:g} x eps({plan.governing_dtype}) "
                                                                  "x RMS(oracle tensor)",
            "rule": "alternative_error <= multiplier * reference_error + floor (errors against the float64 oracle, "
                    "over finite pairs; the alternative may not have more non-finite mismatches than the reference)",
        }

    @staticmethod
    def reference_is_oracle(ctx: RunContext) -> bool:
        """The reference run is itself the float64 oracle (``python_reference`` in float64)."""
        return ctx.session.reference_backend == "python_reference" and ctx.plan.reference_dtype == "float64"

    @staticmethod
    def _oracle_capture(ctx: RunContext) -> Capture:
        from ...backends import get_backend

        if OracleStage.reference_is_oracle(ctx):
            ctx.performance["oracle"] = {"note": "the reference backend is python_reference in float64: "
                                                 "reused as the oracle"}
            return ctx.reference_capture
        oracle = get_backend("python_reference")
        with Timer() as t:
            call_backend(oracle, "prepare()", lambda: oracle.prepare(ctx.model, "float64", "cpu"))
        cap, ctx.performance["oracle"] = run_measured(oracle, "float64", "cpu", ctx.inputs, list(ctx.plan.keys),
                                                      layer_inputs=False, plan=ctx.plan, prepare_s=t.seconds)
        return cap


class NoiseFloorStage(Stage):
    """Run each backend a second time; run-to-run differences are reported apart from the verdict."""

    name = "noise floor"
    timing_key = "noise_floor_s"
    persists_rows = True

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config["noise_floor"])

    def run(self, ctx: RunContext) -> None:
        keys = list(ctx.plan.keys)
        noise: dict[str, Any] = {}
        for side, backend in (("reference", ctx.reference), ("alternative", ctx.alternative)):
            first = ctx.captures[side]
            again = call_backend(backend, "run() (second run)", lambda b=backend: b.run(ctx.inputs, keys))
            diffs: dict[str, float] = {}
            for key in keys:
                if key in first and key in again:
                    r = compare(first[key], again[key], rtol=0.0, atol=0.0, equal_nan=True, check_dtype=False)
                    diffs[str(key)] = error_metric(r, "max_abs_error") if not r.passed else 0.0
            nondet = [k for k, v in diffs.items() if v != 0.0]
            noise[side] = {"backend": backend.name, "deterministic": not nondet,
                           "max_abs_diff": max(diffs.values(), default=0.0), "nondeterministic_keys": nondet,
                           "per_checkpoint": diffs}
        for o in ctx.outcomes:
            o.run_to_run = {side: noise[side]["per_checkpoint"].get(str(o.key), math.nan) for side in noise}
        ctx.noise = noise


# ------------------------------------------------------------------------------------------------
# keeping the evidence
# ------------------------------------------------------------------------------------------------


class RecordStage(Stage):
    """Keep both sides' tensors of the worst checkpoints (by max abs error) in the tensor store,
    within the session's count and byte budget, and a TensorComparison row per kept pair."""

    name = "record"

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config["tensor_recording_enabled"])

    def run(self, ctx: RunContext) -> None:
        from ...models.tensor_comparison import TensorComparison
        from ...storage.tensor_store import RecordingCandidate, TensorStore

        cfg, sid = ctx.plan.config, ctx.session.session_id
        limit = cfg["tensor_recording_limit"] or ctx.framework_config.get("tensor_recording_limit")
        store = TensorStore.beside_database(ctx.database_path, tensor_recording_limit=limit,
                                            byte_budget=cfg["tensor_recording_byte_budget"])
        candidates = [
            RecordingCandidate(o.key.name, o.key.layer, side, ctx.captures[side][o.key],
                               score=error_metric(o.comparison, "max_abs_error"))
            for o in ctx.outcomes for side in ("reference", "alternative") if o.key in ctx.captures[side]
        ]
        outcome = store.record_session(ctx.db, sid, candidates)
        kept = {(r.checkpoint, r.layer, r.side): r.recording_id for r in outcome.kept}
        for o in ctx.outcomes:
            rid = kept.get((o.key.name, o.key.layer, "reference"))
            aid = kept.get((o.key.name, o.key.layer, "alternative"))
            if rid and aid:
                TensorComparison.from_comparison_result(sid, o.row(), reference_recording_id=rid,
                                                        alternative_recording_id=aid).save(ctx.db)
        ctx.recordings = outcome.summary()


class StoreStage(Stage):
    """The result: verdict and summary written to the session, its status set passed/failed."""

    name = "store"

    def run(self, ctx: RunContext) -> None:
        session, plan = ctx.session, ctx.plan
        perf = ctx.performance
        perf["total_s"] = time.perf_counter() - ctx.started
        if not plan.profiling:
            perf = {"total_s": perf["total_s"], "note": "performance profiling disabled"}
        result = ValidationResult(
            session_id=session.session_id, model_path=session.model_path,
            reference_backend=session.reference_backend, alternative_backend=session.alternative_backend,
            reference_dtype=plan.reference_dtype, alternative_dtype=plan.alternative_dtype, results=ctx.outcomes,
            isolation=ctx.isolation, isolation_note=ctx.isolation_note, oracle=ctx.oracle_report,
            noise_floor=ctx.noise, performance=perf, recordings=ctx.recordings, drilldown=ctx.drilldown,
        )
        session.results = result.summary()
        session.save()
        session.update_status(result.verdict)
        ctx.result = result


#: The stages of a validation, in order; each runs where :meth:`Stage.applies` says so.
DEFAULT_STAGES: tuple[Stage, ...] = (
    LoadStage(),
    PrepareStage(),
    RunBackendStage("reference"),
    RunBackendStage("alternative"),
    CalibrationStage(),
    CompareStage(),
    IsolationStage(),
    OracleStage(),
    NoiseFloorStage(),
    DrillDownStage(),
    RecordStage(),
    StoreStage(),
)
