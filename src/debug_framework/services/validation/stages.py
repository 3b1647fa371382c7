"""The stages of one validation, each a small class over a shared :class:`RunContext`.

The engine (:mod:`debug_framework.services.validation_engine`) runs them in order and alone owns
progress and timing; each checkpoint row is written once (:meth:`RunContext.write_rows`, by the
store stage, or as a failing run stops). Every stage reads the session's configuration as the one
:class:`~debug_framework.models.session_config.SessionConfig` of the plan (``ctx.plan.config``). A
stage only does its work:

====================  ===========================================================================
``load``              the model, the inputs and the plan: create_session's in the same process, else
                      the model loaded (its digest must still match), the saved inputs read, the plan resolved
``prepare``           both backends built and prepared; whether per-layer isolation can run
``reference``         the reference backend's forward pass (wall time, per-layer time, peak memory)
``served``            a served model (``alternative_endpoint``): its tokens' log-probabilities
                      against the reference's and a correct run's (:mod:`.served_stage`); a
                      session with one runs only the stages that read no hidden state
``alternative``       the same for the alternative backend
``calibration``       a trusted implementation at the alternative's precision: the noise bounds
``compare``           every enabled checkpoint compared (:func:`debug_framework.comparison.compare`),
                      beside the calibration's own error there (the noise)
``isolation``         each block of each layer of the alternative (and of the calibration) replayed
                      on the reference's input to that block
``oracle``            both runs against a float64 ``python_reference``
``noise floor``       each backend run again; run-to-run differences reported apart
``precision``         where checkpoints fail: correct runs at each lower precision (bfloat16,
                      float16), for the judge's ``consistent_with`` (:mod:`.precision_stage`)
``drill-down``        inside each diverging layer, the operator that introduces the error
                      (:mod:`.drill_stage`, with ``drill_down: true``)
``record``            the worst checkpoints' tensors kept in the content-addressed tensor store
``store``             the result and its summary written to the session
====================  ===========================================================================

Stages only measure: they add to the run's :class:`~.evidence.Evidence`. No stage decides a
verdict; :func:`.judge.judge` does, from the evidence alone, wherever a stage needs the verdict so
far (:meth:`RunContext.judge`) and once more for the rows and the result the store stage keeps.

Adding a step to validation (a drill-down, a plugin swap-in) means writing one :class:`Stage`
and putting it in :data:`DEFAULT_STAGES` (or passing a list to ``ValidationEngine(stages=...)``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from ...backends.base import Backend, BlockReplayBackend, LayerReplayBackend
from ...backends.capabilities import block_replay_support, layer_replay_support, release
from ...capture.keys import Capture, CheckpointKey, all_checkpoints, layer_input_key
from ...comparison import ComparisonResult, compare, error_metric, select_positions
from ...errors import BackendRuntimeError, ConfigurationError, DebugFrameworkError, ModelLoadingError, ValidationError
from ...jsonio import JsonObject
from ...measure import PeakMemory, Timer, layer_timer
from .calibration import calibration_backend, calibration_dtype, noise_at, tolerance_margin
from .memory import capture_budget, check_memory, session_estimate
from .context import RunContext, Stage, call_backend, own
from .decode_stage import DecodeStage
from .drill_stage import DrillDownStage
from .mark_all import MarkAllStage
from .noise_stage import NoiseRuleStage
from .precision_stage import PrecisionStage
from .served_stage import ServedStage
from .evidence import (
    BlockEvidence,
    CheckpointEvidence,
    LayerEvidence,
    OracleEvidence,
    OracleSetup,
    expert_choice,
    reference_scale,
)
from .plan import ValidationPlan, model_checkpoints
from ...models.session_config import SessionConfig

if TYPE_CHECKING:
    import numpy as np

    from ...modelio import ModelInputs

__all__ = ["RunContext", "Stage", "call_backend", "LoadStage", "PrepareStage", "RunBackendStage", "CalibrationStage",
           "CompareStage", "IsolationStage", "OracleStage", "NoiseFloorStage", "RecordStage", "StoreStage",
           "DrillDownStage", "DecodeStage", "PrecisionStage", "MarkAllStage", "ServedStage", "NoiseRuleStage",
           "DEFAULT_STAGES"]


# ------------------------------------------------------------------------------------------------
# load and prepare
# ------------------------------------------------------------------------------------------------


class LoadStage(Stage):
    """The model (its digest must still match the session's), the saved inputs and the plan."""

    name = "load"
    reads_hidden_states = False
    timing_key = "model_load_s"

    def run(self, ctx: RunContext) -> None:
        built = ctx.prebuilt
        if built is not None and built.model.digest == ctx.session.weights_digest:  # handed on, not read again
            ctx.model, ctx.inputs, ctx.plan = built.model, built.inputs, built.plan
            return
        self._load(ctx)

    @staticmethod
    def _load(ctx: RunContext) -> None:
        """A run in another process (a batch item, a resumed session): the model loaded, its digest
        checked, the inputs read from the session's file and the plan resolved."""
        from ...modelio import ModelInputs, load_model

        session = ctx.session
        model = load_model(session.model_path, tier=ctx.config.model_tier)
        if session.weights_digest and model.digest != session.weights_digest:
            raise ModelLoadingError(
                "the weights changed since the session was created (digest mismatch)",
                file=session.model_path, hint="create a new session for the new weights",
            )
        if not session.inputs_ref:
            raise ValidationError("the session has no saved inputs", session=session.session_id)
        ctx.inputs = ModelInputs.load(session.inputs_ref)
        ctx.model = model
        ctx.plan = ValidationPlan.resolve(ctx.config, model.num_layers, model.router_layers,
                                          model_checkpoints(model))


class PrepareStage(Stage):
    """Both backends built and prepared; isolation decided (required but impossible is DF005)."""

    name = "prepare"
    reads_hidden_states = False

    def run(self, ctx: RunContext) -> None:
        from ...backends import get_backend

        plan, session = ctx.plan, ctx.session
        cfg = plan.config
        built = ctx.prebuilt  # the backends create_session built in this process, else new ones
        if built is not None:
            ctx.reference, ctx.alternative = built.reference, built.alternative
        else:
            ctx.reference = get_backend(session.reference_backend, **cfg.reference_options)
            ctx.alternative = get_backend(session.alternative_backend, **cfg.alternative_keywords())
        _estimate_memory(ctx, checked=built is not None)
        for side, backend, dtype, device in (
            ("reference", ctx.reference, plan.reference_dtype, cfg.reference_device),
            ("alternative", ctx.alternative, plan.alternative_dtype, cfg.device),
        ):
            ctx.prepare_s[side] = ctx.prepare_backend(backend, side, dtype, device)
        isolate = cfg.isolate
        if not isolate:
            ctx.isolating, ctx.evidence.isolation_note = False, "isolation not requested"
            return
        ok, why = _replay_support(ctx.reference, ctx.alternative)
        if isolate is True and not ok:
            raise ConfigurationError(f"isolation was requested but {why}", session=session.session_id,
                                  hint="set isolate to 'auto' or false, or give the backend a run_layer")
        ctx.isolating, ctx.evidence.isolation_note = ok, (None if ok else why)


def _estimate_memory(ctx: RunContext, *, checked: bool) -> None:
    """The session's memory estimate, recorded under ``performance["memory"]``; checked against the
    budget (DF007 when over it) unless ``create_session`` did so in this process."""
    plan = ctx.plan
    calibrator = ctx.prebuilt.calibrator if ctx.prebuilt is not None else None
    if calibrator is None and (plan.config.calibrate or plan.config.oracle):
        try:  # only counted here; the calibration stage builds (and checks) its own
            calibrator = calibration_backend(plan, ctx.session.alternative_backend, ctx.model, ctx.alternative)
        except DebugFrameworkError:
            calibrator = None
    estimate = session_estimate(ctx.model, plan, ctx.reference, ctx.alternative, calibrator, ctx.inputs,
                                capture_budget(ctx.framework_config))
    if estimate is None:
        return
    budget = None if checked else check_memory(estimate, ctx.framework_config, reference_dtype=plan.reference_dtype,
                                                   alternative_dtype=plan.alternative_dtype)
    memory = cast("dict[str, object]", ctx.performance.setdefault("memory", {}))  # the engine's memory record
    memory["estimate_bytes"] = estimate.to_dict()
    if budget is not None:
        memory["budget_bytes"] = budget


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
                 layer_inputs: bool, plan: ValidationPlan, prepare_s: float) -> tuple[Capture, JsonObject]:
    """One forward pass of a prepared backend with the plan's profiling: ``(capture, stats)``."""
    mem = PeakMemory(device) if plan.memory_profiling else contextlib.nullcontext()
    with layer_timer(backend, plan.per_layer_timing) as timing, Timer() as wall, mem:
        cap = call_backend(backend, "run()", lambda: backend.run(own(inputs), taps, capture_layer_inputs=layer_inputs))
    stats: JsonObject = {"backend": backend.name, "dtype": dtype, "device": device, "prepare_s": prepare_s,
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

    captures = True

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
            backend, dtype, device = ctx.reference, plan.reference_dtype, plan.config.reference_device
        else:
            backend, dtype, device = ctx.alternative, plan.alternative_dtype, plan.config.device
        taps = plan.all_keys if ctx.isolating else list(plan.keys)
        drill = self.side == "reference" and plan.config.drill_down  # the drill-down's layer inputs
        ctx.captures[self.side], ctx.performance[self.side] = run_measured(
            backend, dtype, device, ctx.inputs, taps, layer_inputs=ctx.isolating or drill, plan=plan,
            prepare_s=ctx.prepare_s[self.side])


# ------------------------------------------------------------------------------------------------
# measuring (the verdicts are the judge's: judge.py)
# ------------------------------------------------------------------------------------------------


def _compare_key(ref: Capture, alt: Capture, key: CheckpointKey, plan: ValidationPlan,
                 name: str | None = None, positions: np.ndarray | None = None) -> ComparisonResult:
    tol = plan.tolerance(key)
    for side, cap in (("alternative", alt), ("reference", ref)):
        if key not in cap:
            return ComparisonResult(passed=False, reason=f"the {side} backend produced no tensor for {key}",
                                    tolerance=tol, name=name or str(key))
    return compare(ref[key], alt[key], tolerance=tol, check_dtype=False, name=name or str(key), positions=positions)


class CalibrationStage(Stage):
    """The trusted implementation (``calibration_backend``; default ``torch_reference``) run at the
    alternative's dtype on the same inputs: its error against the reference is each checkpoint's
    noise (:mod:`.calibration`). Also the oracle mode's baseline when the reference is the oracle."""

    name = "calibration"
    timing_key = "calibration_s"
    captures = True

    def applies(self, config: SessionConfig) -> bool:
        return config.calibrate or config.oracle

    def ready(self, ctx: RunContext) -> bool:
        """Some checkpoint is calibrated, or oracle mode needs a baseline (the reference is the oracle)."""
        plan = ctx.plan
        oracle_baseline = plan.config.oracle and OracleStage.reference_is_oracle(ctx)
        return oracle_baseline or any(plan.calibrated(k) for k in plan.keys)

    def run(self, ctx: RunContext) -> None:
        plan, dtype = ctx.plan, calibration_dtype(ctx.plan, ctx.model)
        built = ctx.prebuilt.calibrator if ctx.prebuilt is not None else None
        backend = built or calibration_backend(plan, ctx.session.alternative_backend, ctx.model, ctx.alternative)
        prepare_s = ctx.prepare_backend(backend, "calibration", dtype, "cpu")
        taps = plan.all_keys if ctx.isolating else list(plan.keys)
        ctx.captures["calibration"], ctx.performance["calibration"] = run_measured(
            backend, dtype, "cpu", ctx.inputs, taps, layer_inputs=False, plan=plan, prepare_s=prepare_s)
        ctx.calibrator = backend


def _experts_per_token(ctx: RunContext) -> int:
    return int(getattr(ctx.model.config, "experts_per_token", 0) or 0)


def _module_of(key: CheckpointKey, *captures: Capture) -> str | None:
    """The module path a backend reports for a checkpoint (``Capture.meta["modules"]``), if any."""
    for cap in captures:
        modules = cap.meta.get("modules")
        if isinstance(modules, Mapping) and str(key) in modules:
            return str(modules[str(key)])
    return None


class CompareStage(Stage):
    """Every enabled checkpoint measured, in model order: the alternative against the reference,
    the calibration run against the reference (the noise), the reference's scale and, where a
    tolerance may judge it, the tolerance's margin."""

    name = "compare"
    timing_key = "comparison_s"

    def run(self, ctx: RunContext) -> None:
        ref, alt, calib = ctx.reference_capture, ctx.alternative_capture, ctx.captures.get("calibration")
        graph_tensors = getattr(ctx.model.config, "checkpoint_tensors", None) or {}  # an ONNX file's tensor names
        pos = ctx.positions  # padded positions are not model outputs: no metric reads them
        for key in ctx.plan.keys:
            comp = _compare_key(ref, alt, key, ctx.plan, positions=pos)
            both = key in ref and key in alt
            ev = CheckpointEvidence(key=key, comparison=comp,
                                    reference_rms=reference_scale(select_positions(ref[key], pos)) if both else math.nan,
                                    noise=noise_at(key, ref, calib, positions=pos) if ctx.plan.calibrated(key) else None,
                                    module=graph_tensors.get(str(key)) or _module_of(key, ref, alt))
            if key.name == "router_logits" and both:
                cal = calib.tensors.get(key) if calib is not None else None
                ev.expert_choice = expert_choice(select_positions(ref[key], pos), select_positions(alt[key], pos),
                                                 _experts_per_token(ctx), select_positions(cal, pos))
            if both and (ev.noise is None) and comp.tolerance.pass_rule == "allclose":
                ev.tolerance_margin = tolerance_margin(select_positions(ref[key], pos),
                                                       select_positions(alt[key], pos), comp.tolerance)
            ctx.evidence.checkpoints.append(ev)


class IsolationStage(Stage):
    """Introduced vs carried-in error per layer, each block on the reference's input to it: the
    attention block on the reference's layer input, the MLP block on the reference's
    post-attention state (where the alternative can run it alone), and the whole layer on the
    reference's layer input; the calibration replays the same blocks on the same inputs."""

    name = "isolation"
    timing_key = "isolation_s"

    def applies(self, config: SessionConfig) -> bool:
        return bool(config.isolate)

    def ready(self, ctx: RunContext) -> bool:
        return ctx.isolating  # "auto" with a backend that cannot replay a layer: nothing to do

    def run(self, ctx: RunContext) -> None:
        noises = {ev.key: ev.noise for ev in ctx.evidence.checkpoints if ev.noise is not None}
        scales = {ev.key: ev.reference_rms for ev in ctx.evidence.checkpoints if ev.present}
        layers = list(ctx.plan.layer_range)
        ctx.evidence.layers = []
        for n, i in enumerate(layers, 1):
            ctx.evidence.layers.append(layer_evidence(ctx, i, noises, scales))
            ctx.layers_done(n, len(layers))
        ctx.evidence.isolation_note = None
        for backend in (ctx.alternative, ctx.reference, ctx.calibrator):  # the layer cuts' weights, not held on
            if backend is not None:
                release(backend, "replays")


def layer_evidence(ctx: RunContext, i: int, noises: dict[CheckpointKey, ComparisonResult | None],
                   scales: dict[CheckpointKey, float]) -> LayerEvidence:
    """Layer ``i`` replayed block by block on the reference's inputs, by the alternative and by the
    calibration (see :class:`IsolationStage`). ``noises`` and ``scales`` (the reference's RMS per
    checkpoint) are measured once per checkpoint and shared by the layers and their blocks."""
    plan, ref_cap, alt_cap, pos = ctx.plan, ctx.reference_capture, ctx.alternative_capture, ctx.positions
    ref_in = ref_cap.layer_inputs.get(i)
    if ref_in is None:
        raise BackendRuntimeError(f"the reference backend did not record the input of layer {i}",
                                  backend=ctx.reference.name, call="run()",
                                  hint="its run() must fill Capture.layer_inputs when capture_layer_inputs=True")
    k_in = layer_input_key(i)
    k_attn, k_mlp = CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)
    alt_in = alt_cap.layer_inputs.get(i)
    if alt_in is None:  # the layer's input is the previous layer's output
        alt_in = alt_cap.tensors.get(k_in)
    if alt_in is None:
        carried = ComparisonResult(passed=False, reason=f"the alternative's input to layer {i} is unknown",
                                   tolerance=plan.tolerance(k_in), name=f"layer {i} input")
    else:
        carried = compare(ref_in, alt_in, tolerance=plan.tolerance(k_in), check_dtype=False, name=f"layer {i} input",
                          positions=pos)
    alternative = cast(LayerReplayBackend, ctx.alternative)  # PrepareStage checked layer_replay_support
    replay = call_backend(alternative, f"run_layer({i})", lambda: alternative.run_layer(i, own(ref_in), own(ctx.inputs)))
    calibrator = ctx.calibrator if plan.config.calibrate else None
    cal_replay = None
    if calibrator is not None and layer_replay_support(calibrator)[0]:
        cal = cast(LayerReplayBackend, calibrator)
        cal_replay = call_backend(cal, f"run_layer({i})", lambda: cal.run_layer(i, own(ref_in), own(ctx.inputs)))

    def block(name: str, key: CheckpointKey, alt: Capture, cal: Capture | None) -> BlockEvidence:
        if key not in scales:
            scales[key] = reference_scale(select_positions(ref_cap.tensors.get(key), pos))
        noise = None if cal is None else noise_at(key, ref_cap, cal, positions=pos)
        return BlockEvidence(name, key, _compare_key(ref_cap, alt, key, plan, f"{key} replayed ({name})", pos), noise,
                             scales[key])

    attention = block("attention", k_attn, replay, cal_replay) if k_attn in replay else None
    whole = block("layer", k_mlp, replay, cal_replay)
    mlp, note = None, None
    ref_attn = ref_cap.tensors.get(k_attn)
    ok, why = block_replay_support(ctx.alternative)
    if ref_attn is None:
        note = f"the reference has no post-attention state of layer {i}"
    elif not ok:
        note = f"the alternative {ctx.alternative.name!r} {why}"
    else:
        alt_b = cast(BlockReplayBackend, ctx.alternative)
        alt_mlp = call_backend(alt_b, f"run_block({i}, 'mlp')", lambda: alt_b.run_block(i, "mlp", own(ref_attn), own(ctx.inputs)))
        cal_mlp = None
        if calibrator is not None and block_replay_support(calibrator)[0]:
            cal_b = cast(BlockReplayBackend, calibrator)
            cal_mlp = call_backend(cal_b, f"run_block({i}, 'mlp')", lambda: cal_b.run_block(i, "mlp", own(ref_attn), own(ctx.inputs)))
        mlp = block("mlp", k_mlp, alt_mlp, cal_mlp)
    total = None
    if k_mlp in alt_cap and k_mlp in ref_cap:
        enabled = ctx.evidence.at(k_mlp)  # the compare stage's, when post_mlp:i is an enabled checkpoint
        total = enabled.comparison if enabled is not None else _compare_key(ref_cap, alt_cap, k_mlp, plan,
                                                                             positions=pos)
    calib = ctx.captures.get("calibration")
    for k in (k_in, k_mlp):  # each checkpoint's noise measured once (layer i's input is layer i-1's output)
        if k not in noises:
            noises[k] = noise_at(k, ref_cap, calib, positions=pos)
    return LayerEvidence(layer=i, carried_in=carried, total=total, attention=attention, mlp=mlp, whole=whole,
                         noise_in=noises[k_in], noise_out=noises[k_mlp], replay_s=float(replay.elapsed_s),
                         mlp_note=note)


def _oracle_name(ctx: RunContext) -> str:
    from ...backends.reference_choice import oracle_for

    return oracle_for(ctx.model)


class OracleStage(Stage):
    """Both runs against ``python_reference`` in float64 (the reference itself when it already is
    that): the baseline is the reference, or, when the reference is the oracle, the calibration run
    (the trusted implementation at the alternative's precision). The judge applies the ratio rule
    ``err(alt, oracle) <= m * err(baseline, oracle) + floor``; the floor is ``oracle_floor`` when
    given, else ``floor_eps x eps(dtype) x RMS(oracle tensor)``."""

    name = "oracle"
    timing_key = "oracle_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.oracle

    def run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        oracle_cap = ctx.captures["oracle"] = self._oracle_capture(ctx)  # the noise rule compares with it too
        cfg = plan.config
        fixed_floor = cfg.oracle_floor
        base_name, base_cap = "the reference", ctx.reference_capture
        if oracle_cap is ctx.reference_capture:  # the reference is the oracle: judge against the trusted run
            base_name, base_cap = f"a correct {plan.alternative_dtype} run", ctx.captures["calibration"]
        alt_cap, pos = ctx.alternative_capture, ctx.positions
        for ev in ctx.evidence.checkpoints:
            k = ev.key
            if k not in oracle_cap or k not in base_cap or k not in alt_cap:
                continue  # no oracle evidence: the judge fails it, naming the missing tensor
            ev.oracle = OracleEvidence(compare(oracle_cap[k], base_cap[k], check_dtype=False, positions=pos),
                                       compare(oracle_cap[k], alt_cap[k], check_dtype=False, positions=pos),
                                       reference_scale(select_positions(oracle_cap[k], pos)))
        ctx.evidence.oracle = OracleSetup(cfg.oracle_metric, cfg.oracle_multiplier, fixed_floor, base_name)
        ctx.oracle_report = {
            "oracle_backend": _oracle_name(ctx), "oracle_dtype": "float64", "metric": cfg.oracle_metric,
            "multiplier": cfg.oracle_multiplier, "baseline": base_name,
            "floor": fixed_floor if fixed_floor is not None else f"{cfg.floor_eps:g} x eps({plan.governing_dtype}) "
                                                                  "x RMS(oracle tensor)",
            "rule": "alternative_error <= multiplier * reference_error + floor (errors against the float64 oracle, "
                    "over finite pairs; the alternative may not have more non-finite mismatches than the reference)",
        }

    @staticmethod
    def reference_is_oracle(ctx: RunContext) -> bool:
        """The reference run is itself the float64 oracle (``python_reference``, or ``float64_eager``
        for a generic-tier model, in float64)."""
        return ctx.session.reference_backend == _oracle_name(ctx) and ctx.plan.reference_dtype == "float64"

    @staticmethod
    def _oracle_capture(ctx: RunContext) -> Capture:
        from ...backends import get_backend

        if OracleStage.reference_is_oracle(ctx):
            ctx.performance["oracle"] = {"note": f"the reference backend is {_oracle_name(ctx)} in float64: "
                                                 "reused as the oracle"}
            return ctx.reference_capture
        oracle = get_backend(_oracle_name(ctx))
        prepare_s = ctx.prepare_backend(oracle, "oracle", "float64", "cpu")
        cap, ctx.performance["oracle"] = run_measured(oracle, "float64", "cpu", ctx.inputs, list(ctx.plan.keys),
                                                      layer_inputs=False, plan=ctx.plan, prepare_s=prepare_s)
        return cap


class NoiseFloorStage(Stage):
    """Run each backend a second time; run-to-run differences are reported apart from the verdict."""

    name = "noise floor"
    timing_key = "noise_floor_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.noise_floor

    def run(self, ctx: RunContext) -> None:
        keys = list(ctx.plan.keys)
        noise: dict[str, JsonObject] = {}
        for side, backend in (("reference", ctx.reference), ("alternative", ctx.alternative)):
            first = ctx.captures[side]
            again = call_backend(backend, "run() (second run)", lambda b=backend: b.run(own(ctx.inputs), keys))
            diffs: dict[str, float] = {}
            for key in keys:
                if key in first and key in again:
                    r = compare(first[key], again[key], rtol=0.0, atol=0.0, equal_nan=True, check_dtype=False,
                                positions=ctx.positions)
                    diffs[str(key)] = error_metric(r, "max_abs_error") if not r.passed else 0.0
            nondet = [k for k, v in diffs.items() if v != 0.0]
            noise[side] = {"backend": backend.name, "deterministic": not nondet,
                           "max_abs_diff": max(diffs.values(), default=0.0), "nondeterministic_keys": nondet,
                           "per_checkpoint": diffs}
        for ev in ctx.evidence.checkpoints:
            ev.run_to_run = {side: noise[side]["per_checkpoint"].get(str(ev.key), math.nan) for side in noise}
        ctx.noise = noise


# ------------------------------------------------------------------------------------------------
# keeping the evidence
# ------------------------------------------------------------------------------------------------


class RecordStage(Stage):
    """Keep both sides' tensors of the worst checkpoints (by max abs error) in the tensor store,
    within the session's count and byte budget, and a TensorComparison row per kept pair."""

    name = "record"

    def applies(self, config: SessionConfig) -> bool:
        return config.tensor_recording_enabled

    def run(self, ctx: RunContext) -> None:
        from ...models.tensor_comparison import TensorComparison
        from ...storage.tensor_store import RecordingCandidate, TensorStore

        cfg, sid = ctx.plan.config, ctx.session.session_id
        limit = cfg.tensor_recording_limit or ctx.framework_config.get("tensor_recording_limit")
        store = TensorStore.beside_database(ctx.database_path, tensor_recording_limit=limit,  # type: ignore[arg-type]
                                            byte_budget=cfg.tensor_recording_byte_budget)
        result = ctx.current_result()
        candidates = [
            RecordingCandidate(r.key.name, r.key.layer, side, ctx.captures[side][r.key],
                               score=error_metric(r.comparison, "max_abs_error"))
            for r in result.results for side in ("reference", "alternative") if r.key in ctx.captures[side]
        ]
        outcome = store.record_session(ctx.db, sid, candidates)
        kept = {(r.checkpoint, r.layer, r.side): r.recording_id for r in outcome.kept}
        for r in result.results:
            rid = kept.get((r.key.name, r.key.layer, "reference"))
            aid = kept.get((r.key.name, r.key.layer, "alternative"))
            if rid and aid:
                TensorComparison.from_comparison_result(sid, r.to_row(), reference_recording_id=rid,
                                                        alternative_recording_id=aid).save(ctx.db)
        ctx.recordings = outcome.summary()


class StoreStage(Stage):
    """The result (the evidence as the judge decided it): its summary written to the session, the
    session's status set passed/failed; first the guard of the weights the references read
    (:meth:`RunContext.check_weights`)."""

    name = "store"
    reads_hidden_states = False

    def run(self, ctx: RunContext) -> None:
        ctx.check_weights()  # the weights the references read unchanged, or no verdict at all
        session, plan = ctx.session, ctx.plan
        perf = ctx.performance
        perf["total_s"] = time.perf_counter() - ctx.started
        if not plan.profiling:
            perf = {"total_s": perf["total_s"], "note": "performance profiling disabled"}
        ctx.performance = perf
        result = ctx.current_result()
        ctx.write_rows(result)  # every row, once, as the judge decided it from all the evidence
        session.results = result.summary()
        ctx.db.sessions.update(session.session_id, results=session.results)
        ctx.db.sessions.update_status(session.session_id, result.verdict)
        ctx.result = result


#: The stages of a validation, in order; each runs where :meth:`Stage.applies` says so.
DEFAULT_STAGES: tuple[Stage, ...] = (
    LoadStage(),
    PrepareStage(),
    RunBackendStage("reference"),
    ServedStage(),
    RunBackendStage("alternative"),
    CalibrationStage(),
    CompareStage(),
    DecodeStage(),
    IsolationStage(),
    OracleStage(),
    NoiseRuleStage(),
    NoiseFloorStage(),
    PrecisionStage(),
    MarkAllStage(),
    DrillDownStage(),
    RecordStage(),
    StoreStage(),
)
