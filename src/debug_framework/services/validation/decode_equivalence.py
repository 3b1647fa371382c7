"""Where a long decode's failure starts: prefill equivalence (docs/validation.md, "Decode steps").

For the first decode step ``s`` that fails, the alternative runs the same tokens again as one
prefill: the prompt and the ``s`` tokens fed at steps 1..s, each at the position the decode gave it.
Its last position computes what decode step ``s`` computed, without the cache the decode built. It
is measured against the reference's decode step ``s`` at the failing checkpoint and judged by the
step's own bound (the calibration's noise there):

* the prefill passes where the decode failed: the same computation is right without the cache, so
  the decode path (the KV cache written or read across the steps) is wrong: ``"cache"``;
* it fails as well: the tokens computed in one pass diverge too, so the error is not the cache's but
  the computation's at that length (accumulated over the positions): ``"accumulation"``.

The finding goes to ``result.decode["prefill_equivalence"]``.
"""

from __future__ import annotations

import numpy as np

from ...backends.base import Backend
from ...capture.keys import CheckpointKey
from ...comparison import compare, error_metric
from ...jsonio import JsonObject
from ...modelio.inputs import ModelInputs
from .context import RunContext, call_backend, own
from .evidence import CheckpointEvidence, reference_scale
from .judge import judge_checkpoint

__all__ = ["replayed_as_prefill", "prefill_equivalence"]


def replayed_as_prefill(inputs: ModelInputs, tokens: np.ndarray, step: int) -> ModelInputs:
    """``inputs`` with the tokens of decode steps 1..``step`` appended to every row (after its
    padding, as the decode appends them), each at the position the decode gave it."""
    batch = inputs.shape[0]
    fed = np.asarray(tokens, np.int64)[:, :step]
    ids = np.concatenate([inputs.input_ids, fed], axis=1)
    mask = np.concatenate([inputs.attention_mask, np.ones((batch, step), np.int64)], axis=1)
    offset = int(inputs.meta.get("position_offset", 0) or 0)
    longer = ModelInputs(ids, mask, None, meta=dict(inputs.meta),
                         extra={k: v for k, v in inputs.extra.items() if k != "position_ids"})
    return longer.with_positions(offset)


def prefill_equivalence(ctx: RunContext, alternative: Backend, step: int, key: CheckpointKey,
                        reference_at_step: object, tokens: np.ndarray) -> JsonObject:
    """The alternative's prefill of the same tokens against the reference's decode step ``step`` at
    ``key`` (see the module): ``{step, checkpoint, decode_error, prefill_error, bound, finding,
    explanation}``; ``finding`` is None with a ``note`` where the alternative cannot run it."""
    record: JsonObject = {"step": step, "checkpoint": str(key)}
    ev = next((e for e in reversed(ctx.evidence.checkpoints) if e.step == step and e.key == key), None)
    if ev is None or reference_at_step is None:
        return {**record, "finding": None, "note": f"no measurement of {key} at decode step {step}"}
    longer = replayed_as_prefill(ctx.inputs, tokens, step)
    capture = call_backend(alternative, f"run() of the prompt and {step} decoded tokens",
                           lambda: alternative.run(own(longer), [key]))
    got = capture.tensors.get(key)
    if got is None or len(getattr(got, "shape", ())) < 2:
        return {**record, "finding": None, "note": f"the alternative's prefill gave no {key}"}
    last = got[:, -1:]
    err = compare(reference_at_step, last, tolerance=ctx.plan.tolerance(key), check_dtype=False,
                  name=f"{key}@{step} replayed as one prefill")
    probe = CheckpointEvidence(key=key, comparison=err, step=step, noise=ev.noise,
                               reference_rms=reference_scale(reference_at_step))
    verdict = judge_checkpoint(probe, ctx.evidence, ctx.plan)
    metric = ctx.plan.config.calibration_metric
    finding = "accumulation" if not verdict.passed else "cache"
    explanation = (f"the same {step} tokens replayed as one prefill give {key} within its bound at step {step}: "
                   "the decode's cache (written or read across the steps) is wrong" if finding == "cache" else
                   f"the same {step} tokens replayed as one prefill diverge at {key} too: the error is the "
                   "computation's at this length (accumulated over the positions), not the cache's")
    return {**record, "metric": metric, "decode_error": error_metric(ev.comparison, metric),
            "prefill_error": error_metric(err, metric), "bound": verdict.bound, "passed": verdict.passed,
            "finding": finding, "explanation": explanation}
