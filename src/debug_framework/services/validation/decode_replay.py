"""Isolation at a decode step: where the prefill passes and decode step s is the first to fail, at
layer L, layer L is replayed at step s on the reference's input to it (its hidden state at that
step), over the backend's own cache (the prefill and the steps before s run as in the decode), by
the alternative and by the calibration; so is every other layer failing at step s (each replay
costs the prefill and s steps). Judged by the same calibrated rule as a block replay of the
prefill: a replay beyond its bound says that layer's decode path introduces the error at that step
(for L: the source is confirmed); one within it says the error came in with the layer's input or
its cache (``Verdict.decode_layers``). A backend without
``run_decode_layer(i, hidden_in, inputs, step, tokens)`` leaves a note saying so.
"""

from __future__ import annotations


import numpy as np

from ...backends.base import Backend
from ...backends.capabilities import capabilities
from ...backends.decode import DecodeRun
from ...capture.keys import CapturedTensor, CheckpointKey, layer_input_key
from ...comparison import compare
from .context import RunContext, StepInputs, call_backend, own
from .evidence import BlockEvidence, reference_scale

__all__ = ["replay_decode_layer", "step_inputs"]


def step_inputs(ctx: RunContext, ref_run: DecodeRun, tokens: np.ndarray) -> StepInputs | None:
    """The reference's inputs to every layer at the first divergent decode step, for the drill-down
    (:class:`~.context.StepInputs`); None where the prefill fails or no decode step does."""
    step = ctx.judge().first_step
    if not step or step >= len(ref_run.captures):
        return None
    at = ref_run.captures[step].tensors
    layers = range(int(getattr(ctx.model, "num_layers", 0) or 0))
    hidden = {i: at[layer_input_key(i)] for i in layers if layer_input_key(i) in at}
    past = ref_run.cache_at(step - 1)  # the whole cache before the step (new entries appended to the last whole one)
    return StepInputs(step, np.asarray(tokens), hidden, past)


def _replayer(backend: Backend | None) -> Backend | None:
    return backend if backend is not None and capabilities(backend).decode_layer_replay.ok else None


def replay_decode_layer(ctx: RunContext, ref_run: DecodeRun, tokens: np.ndarray, calibrator: Backend | None) -> None:
    """Replay every layer that fails at the first divergent decode step at that step (see the
    module), the first divergence's layer first; sets ``ctx.evidence.decode_replay`` or
    ``decode_replay_note``. Nothing where the prefill fails, no decode step fails, a KV cache is
    already named the source, or the divergence is in no layer."""
    verdict = ctx.judge()
    first, step = verdict.first_divergence, verdict.first_step
    if not step or first is None or first.layer is None or (verdict.error_source or {}).get("kind") != "decode":
        return
    alt = _replayer(ctx.alternative)
    if alt is None:
        ctx.evidence.decode_replay_note = (
            f"the alternative {ctx.alternative.name!r} cannot replay a layer at a decode step (no run_decode_layer)")
        return
    # each layer's first failing checkpoint at the step that its replay gives (a layer failing first
    # elsewhere, as at its router's logits, is judged by its output)
    failing: dict[int, CheckpointKey] = {first.layer: first if first.name in _REPLAYED else CheckpointKey("post_mlp", first.layer)}
    for (s, key), judgement in verdict.steps.items():
        if s == step and not judgement.passed and key.layer is not None and key.name in _REPLAYED:
            failing.setdefault(key.layer, key)
    blocks: dict[int, BlockEvidence] = {}
    for i, key in failing.items():
        ref_in = ref_run.captures[step].tensors.get(layer_input_key(i))
        if ref_in is None:
            if i == first.layer:
                ctx.evidence.decode_replay_note = (f"the reference recorded no {layer_input_key(i)} at decode step "
                                                   f"{step}, the input of layer {i}")
                return
            continue
        blocks[i] = _replay(ctx, alt, calibrator, ref_run, tokens, step, key, ref_in)
    ctx.evidence.decode_replay = (step, blocks)


#: the checkpoints of a layer its replay gives (``run_decode_layer``'s)
_REPLAYED = ("post_attention", "post_mlp")


def _replay(ctx: RunContext, alt: Backend, calibrator: Backend | None, ref_run: DecodeRun, tokens: np.ndarray, step: int,
            key: CheckpointKey, ref_in: CapturedTensor) -> BlockEvidence:
    """Layer ``key.layer`` replayed at ``step`` on ``ref_in`` by the alternative and the calibration,
    its checkpoint ``key`` measured against the reference's at that step."""
    i = key.layer
    assert i is not None
    replay = call_backend(alt, f"run_decode_layer({i}, step {step})",
                          lambda: alt.run_decode_layer(i, own(ref_in), own(ctx.inputs), step, own(tokens)))
    cal = _replayer(calibrator) if ctx.plan.calibrated(key) else None
    cal_replay = None if cal is None else call_backend(
        cal, f"run_decode_layer({i}, step {step})", lambda: cal.run_decode_layer(i, own(ref_in), own(ctx.inputs), step, own(tokens)))
    ref_out = ref_run.captures[step].tensors[key]
    tol = ctx.plan.tolerance(key)
    err = compare(ref_out, replay.tensors[key], tolerance=tol, check_dtype=False, name=f"{key}@{step} replayed")
    noise = None if cal_replay is None else compare(ref_out, cal_replay.tensors[key], tolerance=tol,
                                                    check_dtype=False, name=f"{key}@{step} calibration replay")
    block = "attention" if key.name == "post_attention" else "layer"
    return BlockEvidence(block, key, err, noise, reference_scale(ref_out))
