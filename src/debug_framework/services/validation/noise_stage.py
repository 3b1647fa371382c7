"""The noise rule in validation: before a checkpoint is called a failure on one correct run's error,
measure the noise a correct run can have there.

The calibrated rule (``err <= noise_margin x noise + floor``) and the oracle's ratio rule take the
trusted side's error from *one* run. Where a checkpoint's output is ill-conditioned (a reciprocal
near its pole, a norm of a state that cancels to almost nothing) an equally correct implementation
that rounds an intermediate differently lands far from where that one run happened to land, and the
single-run bound is a false alarm. So where a checkpoint exceeds its single-run bound, this stage
runs the trusted side again, :data:`~debug_framework.comparison.NOISE_RUNS` times, each on the
model's weights and floating inputs moved within the rounding of the precision it computes at
(:class:`PerturbedWeights`, :func:`perturbed_inputs`: each value moved by at most :data:`FRACTION`
of an ulp of that precision before the run rounds it, so that a correct run's roundings are
resampled, not made worse; a value already at that precision by one ulp of its own, the backward
error every correct implementation is allowed), and keeps each run's comparison with the
same tensor its single run was compared with (``CheckpointEvidence.perturbed``). The judge then
applies the one noise rule of KernelDiff and the op sweeps
(:func:`~debug_framework.comparison.judge_with_noise`): the bound only widens, and only by what was
measured; a real bug is no rounding noise and still fails.

The trusted side is the calibration backend (the calibrated rule, and the oracle mode's baseline
where the reference is the oracle) or the reference backend (the oracle mode's baseline otherwise).
An ONNX file's graph runner moves the weights it feeds (``perturb_array``); a backend whose weights
do not come from the loaded model is run on perturbed floating inputs only. Only prefill
checkpoints are measured (decode steps are the decode stage's).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np

from ...backends.base import Backend, BlockReplayBackend, LayerReplayBackend
from ...backends.capabilities import block_replay_support, layer_replay_support, model_for, release
from ...capture.keys import Capture, CheckpointKey
from ...comparison import NOISE_RUNS, ComparisonResult, compare
from ...comparison.noise import perturb_array, perturb_within_rounding
from ...errors import DebugFrameworkError
from ...jsonio import JsonObject
from ...measure import Timer
from ...models.session_config import SessionConfig
from .context import RunContext, Stage, call_backend, own
from .evidence import BlockEvidence, CheckpointEvidence, LayerEvidence
from .judge import PERTURBED_WEIGHTS, judge_block, judge_checkpoint

if TYPE_CHECKING:
    import torch

    from ...modelio import LoadedModel, ModelInputs

#: How far a weight or floating input of the noise rule's runs moves before the trusted run rounds
#: it, in ulps of the precision it computes at: an eighth, so that only values near a rounding's
#: midpoint round the other way (a correct run's rounding resampled, not made worse; a value already
#: at that precision moves by one ulp of its own, the least that changes it).
FRACTION = 0.125

__all__ = ["NoiseRuleStage", "PerturbedWeights", "perturbed_model", "perturbed_inputs"]


def _seed_of(seed: int, name: str) -> int:
    """A seed of its own for each tensor: the same tensor moves the same way whenever it is read."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 62)


class PerturbedWeights(Mapping[str, "torch.Tensor"]):
    """A model's weights with each floating tensor moved within the rounding of ``within`` (a dtype
    name; by :data:`FRACTION` of its ulp) by :func:`~debug_framework.comparison.perturb_within_rounding`, the same way on every
    read; a fresh tensor each time, so nothing written to one reaches the loaded weights. Everything
    else (shapes, dtypes, files, digest) is the weights' own."""

    def __init__(self, weights: Mapping[str, torch.Tensor], seed: int, within: str) -> None:
        self._weights = weights
        self.seed = seed
        self.within = within

    def __getitem__(self, name: str) -> torch.Tensor:
        read = getattr(self._weights, "reading", None)
        tensor = read(name) if callable(read) else self._weights[name]
        return perturb_within_rounding(tensor, _seed_of(self.seed, name), within=self.within, fraction=FRACTION)

    def reading(self, name: str) -> torch.Tensor:
        """The tensor ``name``, perturbed (a copy of its own: read or written alike)."""
        return self[name]

    def __contains__(self, name: object) -> bool:
        return name in self._weights

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def __getattr__(self, name: str) -> object:  # shape, dtype_name, file_of, digest ... of the weights
        return getattr(self._weights, name)

    def numpy(self, name: str, dtype: np.dtype | type = np.float64) -> np.ndarray:
        """The perturbed tensor as a NumPy array of ``dtype``."""
        from ...modelio.weights import tensor_numpy

        return tensor_numpy(self[name], dtype)

    def fork(self) -> PerturbedWeights:
        """The same perturbed weights (each read is a fresh tensor already: a store of their own)."""
        return PerturbedWeights(self._weights, self.seed, self.within)

    @property
    def private(self) -> bool:
        return True

    def perturb_array(self, name: str, array: np.ndarray) -> np.ndarray:
        """A weight array read by other means (an ONNX graph's fed initializers), moved the same way."""
        return perturb_array(array, _seed_of(self.seed, name), within=self.within, fraction=FRACTION)


def perturbed_model(model: LoadedModel, seed: int, within: str) -> LoadedModel:
    """``model`` with its weights perturbed within the rounding of ``within`` (:class:`PerturbedWeights`)."""
    return replace(model, weights=PerturbedWeights(model.weights, seed, within))  # type: ignore[arg-type]


def perturbed_inputs(inputs: ModelInputs, seed: int, within: str) -> ModelInputs:
    """A copy of ``inputs`` with its floating inputs (``extra``: pixel values, features) perturbed
    within the rounding of ``within``; token ids, masks and positions as they are."""
    out = inputs.copy()
    out.extra = {k: perturb_array(v, _seed_of(seed, k), within=within, fraction=FRACTION) for k, v in out.extra.items()}
    return out


class NoiseRuleStage(Stage):
    """Where a checkpoint or a block replay exceeds its single-run bound (calibrated or oracle), the
    trusted side run again on perturbed weights and inputs, ``NOISE_RUNS`` times (see the module's
    docstring)."""

    name = "noise rule"
    timing_key = "noise_rule_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.calibrate or config.oracle

    def ready(self, ctx: RunContext) -> bool:
        return bool(_exceeding(ctx)) or bool(_exceeding_blocks(ctx))

    def run(self, ctx: RunContext) -> None:
        record: JsonObject = {"runs": NOISE_RUNS, "perturbation": PERTURBED_WEIGHTS}
        with Timer() as t:
            try:
                record.update(_measure(ctx, _exceeding(ctx), _exceeding_blocks(ctx)))
            except DebugFrameworkError as exc:  # the trusted side cannot run perturbed: one run's bound stands
                record["skipped"] = exc.message
        record["seconds"] = t.seconds
        ctx.performance["noise_rule"] = record


def _measure(ctx: RunContext, exceeding: list[CheckpointEvidence], blocks: list[tuple[LayerEvidence, str]]
             ) -> JsonObject:
    """Per seed, the trusted side prepared once on perturbed weights: its run on perturbed inputs
    compared at the exceeding checkpoints with what its single run was compared with (kept as
    ``ev.perturbed``), and the calibration's replays of the exceeding blocks, each layer or MLP
    replayed once for all its blocks, on the reference's input to it perturbed (kept as the block's
    ``perturbed``)."""
    from .calibration import calibration_backend, calibration_dtype

    plan = ctx.plan
    side, dtype, device, against, who = _trusted_side(ctx)
    cal_dtype = calibration_dtype(plan, ctx.model)
    calibrator = side if who == "the calibration" else calibration_backend(plan, ctx.session.alternative_backend,
                                                                          ctx.model)
    if blocks and not layer_replay_support(calibrator)[0]:
        blocks = []
    keys = [ev.key for ev in exceeding]
    runs: dict[CheckpointKey, list[ComparisonResult]] = {k: [] for k in keys}
    replays: dict[tuple[int, str], list[ComparisonResult]] = {(layer.layer, part): [] for layer, part in blocks}
    ref = ctx.reference_capture
    for seed in range(1, NOISE_RUNS + 1):
        if keys:
            _prepare(side, ctx.model, seed, dtype, device)
            cap: Capture = call_backend(side, "run() (noise rule)", lambda s=seed: side.run(
                own(perturbed_inputs(ctx.inputs, s, dtype)), keys))
            for key in keys:
                if key in cap and key in against:
                    runs[key].append(compare(against[key], cap[key], check_dtype=False, positions=ctx.positions,
                                             name=f"{key} ({who}, perturbed {seed})"))
            del cap
        if blocks:
            if not keys or calibrator is not side:
                _prepare(calibrator, ctx.model, seed, cal_dtype, "cpu")
            replayed: dict[tuple[int, str], Capture | None] = {}  # the attention and whole-layer blocks: one replay
            for layer, part in blocks:
                b: BlockEvidence = getattr(layer, part)
                kind = "mlp" if b.block == "mlp" else "layer"
                if (layer.layer, kind) not in replayed:
                    replayed[(layer.layer, kind)] = _replay(ctx, calibrator, layer.layer, kind, seed, cal_dtype)
                got = replayed[(layer.layer, kind)]
                if got is not None and b.key in got and b.key in ref:
                    replays[(layer.layer, part)].append(compare(ref[b.key], got[b.key], check_dtype=False,
                                                                positions=ctx.positions,
                                                                name=f"{b.key} replayed ({b.block}, perturbed {seed})"))
    for backend in {id(side): side, id(calibrator): calibrator}.values():
        release(backend, "replays")
        release(backend, "session")
    for ev in exceeding:
        if len(runs[ev.key]) == NOISE_RUNS:  # every run measured, or none is used
            ev.perturbed = tuple(runs[ev.key])
    for layer, part in blocks:
        if len(replays[(layer.layer, part)]) == NOISE_RUNS:
            setattr(layer, part, replace(getattr(layer, part), perturbed=tuple(replays[(layer.layer, part)])))
    out: JsonObject = {}
    if keys:
        out.update({"trusted": side.name, "dtype": dtype, "checkpoints": [str(k) for k in keys]})
    if blocks:
        out["blocks"] = {"trusted": calibrator.name, "dtype": cal_dtype,
                         "replays": [f"layer {layer.layer} ({getattr(layer, part).block})" for layer, part in blocks]}
    return out


def _prepare(backend: Backend, model: LoadedModel, seed: int, dtype: str, device: str) -> None:
    """``backend`` prepared on ``model``'s weights perturbed with ``seed`` (:func:`perturbed_model`)."""
    moved = model_for(backend, perturbed_model(model, seed, dtype))
    call_backend(backend, "prepare() (noise rule)", lambda: backend.prepare(moved, dtype, device))


def _exceeding(ctx: RunContext) -> list[CheckpointEvidence]:
    """The prefill checkpoints whose own rule (calibrated or oracle) fails on one run's noise, not
    yet measured by the noise rule."""
    out = []
    for ev in ctx.evidence.checkpoints:
        if ev.step or ev.perturbed is not None or not ev.present:
            continue
        own_rule = judge_checkpoint(ev, ctx.evidence, ctx.plan)
        if not own_rule.passed and own_rule.judged_by in ("calibration", "oracle") and own_rule.rule is not None:
            out.append(ev)
    return out


#: the parts of a layer's isolation evidence a block replay is kept in
_PARTS = ("attention", "mlp", "whole")


def _exceeding_blocks(ctx: RunContext) -> list[tuple[LayerEvidence, str]]:
    """``(layer evidence, part)`` of each block replayed on the reference's input whose calibrated
    bound (one calibration replay's noise) is exceeded, not yet measured by the noise rule."""
    out = []
    for layer in ctx.evidence.layers or []:
        for part in _PARTS:
            b: BlockEvidence | None = getattr(layer, part)
            if b is None or b.perturbed is not None or b.input != "reference":
                continue
            j = judge_block(b, ctx.plan)
            if not j.passed and j.judged_by == "calibration":
                out.append((layer, part))
    return out


def _replay(ctx: RunContext, trusted: Backend, i: int, kind: str, seed: int, dtype: str) -> Capture | None:
    """The trusted backend's replay of layer ``i`` (``kind`` ``"layer"``) or of its MLP block
    (``"mlp"``) on the reference's input to it, perturbed within the rounding of ``dtype`` (None
    where that input or the block replay is missing)."""
    ref = ctx.reference_capture
    inputs = own(perturbed_inputs(ctx.inputs, seed, dtype))
    if kind == "mlp":
        state = ref.tensors.get(CheckpointKey("post_attention", i))
        if state is None or not block_replay_support(trusted)[0]:
            return None
        runner = cast(BlockReplayBackend, trusted)
        x = _perturbed_tensor(state, seed, dtype)
        return call_backend(trusted, f"run_block({i}, 'mlp') (noise rule)", lambda: runner.run_block(i, "mlp", x, inputs))
    layer_in = ref.layer_inputs.get(i)
    if layer_in is None:
        return None
    replayer = cast(LayerReplayBackend, trusted)
    x = _perturbed_tensor(layer_in, seed, dtype)
    return call_backend(trusted, f"run_layer({i}) (noise rule)", lambda: replayer.run_layer(i, x, inputs))


def _perturbed_tensor(value: object, seed: int, within: str) -> object:
    """A copy of a captured tensor (a NumPy array or a torch tensor) moved within the rounding of ``within``."""
    if isinstance(value, np.ndarray):
        return perturb_array(value, seed, within=within, fraction=FRACTION)
    return perturb_within_rounding(value, seed, within=within, fraction=FRACTION)


def _trusted_side(ctx: RunContext) -> tuple[Backend, str, str, Capture, str]:
    """``(a fresh trusted backend, its dtype, its device, the capture its runs are compared with, its
    role)``: the oracle mode's baseline against the oracle, else the calibration against the reference."""
    from ...backends import get_backend
    from .calibration import calibration_backend, calibration_dtype

    plan = ctx.plan
    oracle = ctx.captures.get("oracle")
    if ctx.evidence.oracle is not None and oracle is not None and oracle is not ctx.reference_capture:
        cfg = plan.config
        reference = get_backend(ctx.session.reference_backend, **cfg.reference_options)
        return reference, plan.reference_dtype, cfg.reference_device, oracle, "the reference"
    trusted = calibration_backend(plan, ctx.session.alternative_backend, ctx.model)
    against = ctx.reference_capture  # the calibrated rule's, and the oracle's when the reference is it
    return trusted, calibration_dtype(plan, ctx.model), "cpu", against, "the calibration"
