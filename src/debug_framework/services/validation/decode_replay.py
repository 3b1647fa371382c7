"""Isolation at a decode step: where the prefill passes and decode step s is the first to fail, at
layer L, layer L is replayed at step s on the reference's input to it (its hidden state at that
step), over the backend's own cache (the prefill and the steps before s run as in the decode), by
the alternative and by the calibration. Judged by the same calibrated rule as a block replay of the
prefill: a replay beyond its bound confirms that layer L's decode path introduces the error; one
within it says the error came in with the layer's input or its cache. A backend without
``run_decode_layer(i, hidden_in, inputs, step, tokens)`` leaves a note saying so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backends.decode import DecodeRun
from ...capture.keys import CheckpointKey
from ...comparison import compare
from .context import RunContext, StepInputs, call_backend
from .evidence import BlockEvidence, reference_scale

__all__ = ["replay_decode_layer", "step_inputs", "layer_input_key"]


def layer_input_key(i: int) -> CheckpointKey:
    """The checkpoint whose tensor is layer ``i``'s input: the embedding's, else layer i - 1's output."""
    return CheckpointKey("post_embedding") if i == 0 else CheckpointKey("post_mlp", i - 1)


def step_inputs(ctx: RunContext, ref_run: DecodeRun, tokens: np.ndarray) -> StepInputs | None:
    """The reference's inputs to every layer at the first divergent decode step, for the drill-down
    (:class:`~.context.StepInputs`); None where the prefill fails or no decode step does."""
    step = ctx.judge().first_step
    if not step or step >= len(ref_run.captures):
        return None
    at = ref_run.captures[step].tensors
    layers = range(int(getattr(ctx.model, "num_layers", 0) or 0))
    hidden = {i: at[layer_input_key(i)] for i in layers if layer_input_key(i) in at}
    past = dict(ref_run.kv_cache[step - 1]) if step - 1 < len(ref_run.kv_cache) else {}
    return StepInputs(step, np.asarray(tokens), hidden, past)


def _replayer(backend: Any) -> Any:
    return backend if callable(getattr(backend, "run_decode_layer", None)) else None


def replay_decode_layer(ctx: RunContext, ref_run: DecodeRun, tokens: np.ndarray, calibrator: Any) -> None:
    """Replay the layer of a first divergence at a decode step (see the module); sets
    ``ctx.evidence.decode_replay`` or ``decode_replay_note``. Nothing where the prefill fails, no
    decode step fails, a KV cache is already named the source, or the divergence is in no layer."""
    verdict = ctx.judge()
    first, step = verdict.first_divergence, verdict.first_step
    if not step or first is None or first.layer is None or (verdict.error_source or {}).get("kind") != "decode":
        return
    i = first.layer
    k_in = layer_input_key(i)
    ref_in = ref_run.captures[step].tensors.get(k_in)
    alt = _replayer(ctx.alternative)
    if ref_in is None or alt is None:
        ctx.evidence.decode_replay_note = (
            f"the reference recorded no {k_in} at decode step {step}, the input of layer {i}" if ref_in is None else
            f"the alternative {ctx.alternative.name!r} cannot replay a layer at a decode step (no run_decode_layer)")
        return
    replay = call_backend(alt, f"run_decode_layer({i}, step {step})",
                          lambda: alt.run_decode_layer(i, ref_in, ctx.inputs, step, tokens))
    cal = _replayer(calibrator) if ctx.plan.calibrated(first) else None
    cal_replay = None if cal is None else call_backend(
        cal, f"run_decode_layer({i}, step {step})", lambda: cal.run_decode_layer(i, ref_in, ctx.inputs, step, tokens))
    ref_out = ref_run.captures[step].tensors[first]
    tol = ctx.plan.tolerance(first)
    err = compare(ref_out, replay.tensors[first], tolerance=tol, check_dtype=False, name=f"{first}@{step} replayed")
    noise = None if cal_replay is None else compare(ref_out, cal_replay.tensors[first], tolerance=tol,
                                                    check_dtype=False, name=f"{first}@{step} calibration replay")
    block = "attention" if first.name == "post_attention" else "layer"
    ctx.evidence.decode_replay = (step, BlockEvidence(block, first, err, noise, reference_scale(ref_out)))
