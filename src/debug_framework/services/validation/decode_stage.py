"""The decode stage: after the prefill, ``decode_steps`` tokens decoded one at a time through each
backend's own KV cache, every step's checkpoints compared (docs/validation.md, "Decode steps").

Both sides see the same sequence (teacher forcing): the tokens are ``decode_tokens`` where given,
else the reference's greedy choice. The calibration backend decodes the same tokens at the
alternative's precision, so each step's checkpoints are judged by the same calibrated rule as the
prefill's. The prefill's rows then carry ``step`` 0 and decode step ``s``'s rows ``step`` s; the KV
cache after each pass is compared per layer (K and V, padded positions left out) and kept in
:attr:`RunContext.decode`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ...backends.base import Backend
from ...backends.decode import KV_TAIL, DecodeRun, decode_support
from ...capture.keys import CapturedTensor, CheckpointKey
from ...comparison import ComparisonResult, Tolerance, compare, error_metric, position_mask, select_positions
from ...comparison.next_token import next_token_metrics
from ...errors import BackendInitializationError, ConfigurationError
from ...jsonio import JsonObject
from ...models.session_config import SessionConfig
from .calibration import calibration_dtype, noise_at
from .context import RunContext, Stage, call_backend, own
from .decode_replay import replay_decode_layer, step_inputs
from .evidence import CheckpointEvidence, KVEvidence, TokenEvidence, reference_scale
from .judge import judge_checkpoint, judge_kv

if TYPE_CHECKING:
    from ...modelio import LoadedModel, ModelInputs

__all__ = ["DecodeStage", "check_decode_tokens", "check_decode_plan", "NOISE_EVERY", "noise_sampled", "NoiseCarry"]

#: the calibration's noise is measured at decode step 1, every this many steps and the last; the
#: steps between carry the last measured (and measure their own where a check fails by the carried)
NOISE_EVERY = 8


def noise_sampled(step: int, steps: int) -> bool:
    """Whether the calibration's noise is measured at decode ``step`` of ``steps`` whatever the
    check: step 1, every :data:`NOISE_EVERY`-th and the last."""
    return step in (1, steps) or step % NOISE_EVERY == 0

#: how to get a decoding reference where the session's cannot decode
_DECODE_HINT = ("use backends that decode (python_reference, torch_reference, pytorch, float64_eager, module "
                "backends, engines with prefill/decode_step), or set decode_steps to 0")


def check_decode_tokens(tokens: object, batch: int, steps: int) -> np.ndarray | None:
    """``decode_tokens`` as ``[batch, steps]`` int64 (one list per row), None when not given.

    Raises:
        ConfigurationError: (DF005) tokens that are not ``batch`` rows of ``steps`` ints.
    """
    if tokens is None:
        return None
    try:
        arr = np.asarray(tokens, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"decode_tokens must be lists of token ids, one per row: {exc}") from exc
    if arr.ndim == 1 and batch == 1:
        arr = arr[None]
    if arr.shape != (batch, steps):
        raise ConfigurationError(f"decode_tokens must be {batch} row(s) of {steps} token id(s) (one per decode step), "
                                 f"got shape {list(arr.shape)}", hint="one list per input row, decode_steps long")
    return arr


def check_decode_plan(config: SessionConfig, inputs: ModelInputs, model: LoadedModel) -> np.ndarray | None:
    """The decode settings checked against the inputs and the model (before any backend runs):
    ``decode_tokens`` one row of ``decode_steps`` ids per input row, and every position (the
    inputs from ``position_offset``, then the steps) within ``max_position_embeddings``. Returns
    the given tokens (None: the reference's greedy choice).

    Raises:
        ConfigurationError: (DF005) saying what to change.
    """
    steps = config.decode_steps
    if not steps:
        return None
    batch, length = inputs.shape
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    offset = config.position_offset
    if limit and offset + length + steps > limit:
        raise ConfigurationError(
            f"{length} input position(s) from {offset} and {steps} decode step(s) exceed the model's "
            f"max_position_embeddings={limit}", hint="fewer decode_steps, shorter inputs or a lower position_offset")
    return check_decode_tokens(config.decode_tokens, batch, steps)


class DecodeStage(Stage):
    """Prefill and ``decode_steps`` decode steps in the reference, the alternative and the
    calibration; each step's checkpoints measured as the compare stage measures the prefill's."""

    name = "decode"
    timing_key = "decode_s"

    def applies(self, config: SessionConfig) -> bool:
        return config.decode_steps > 0

    def run(self, ctx: RunContext) -> None:
        plan = ctx.plan
        steps = plan.config.decode_steps
        given = check_decode_plan(plan.config, ctx.inputs, ctx.model)
        for side, backend in (("reference", ctx.reference), ("alternative", ctx.alternative)):
            ok, why = decode_support(backend)
            if not ok:  # a backend's capability (DF002), as a dtype it does not run
                raise BackendInitializationError(f"the {side} backend {backend.name!r} {why}", backend=backend.name,
                                                 hint=_DECODE_HINT)
        taps = list(plan.keys)
        ref = ctx.reference
        ref_run: DecodeRun = call_backend(ref, "run_decode()",
                                          lambda: ref.run_decode(own(ctx.inputs), steps, taps, own(given)))  # type: ignore[attr-defined]
        tokens = ref_run.tokens if given is None else given
        alt = ctx.alternative
        alt_run: DecodeRun = call_backend(alt, "run_decode()",
                                          lambda: alt.run_decode(own(ctx.inputs), steps, taps, own(tokens)))  # type: ignore[attr-defined]
        cal_run, cal = self._calibration(ctx, steps, taps, tokens)
        for ev in ctx.evidence.checkpoints:
            if ev.step is None:
                ev.step = 0  # the prefill
        noise = NoiseCarry()
        for s in range(1, steps + 1):
            r, a = ref_run.captures[s], alt_run.captures[s]
            c = None if cal_run is None else cal_run.captures[s]
            for key in plan.keys:
                tol = plan.tolerance(key)
                both = key in r and key in a
                comp = compare(r[key], a[key], tolerance=tol, check_dtype=False, name=f"{key}@{s}") if both else \
                    _missing(key, s, "alternative" if key not in a else "reference", tol)
                ev = CheckpointEvidence(key=key, comparison=comp, step=s, module=ev_module(ctx, key),
                                        reference_rms=reference_scale(r[key]) if both else math.nan)
                if plan.calibrated(key):
                    noise.checkpoint(ctx, ev, lambda k=key, r=r, c=c: noise_at(k, r, c), noise_sampled(s, steps))
                ctx.evidence.checkpoints.append(ev)
        ctx.decode = {"steps": steps, "tokens": np.asarray(tokens).tolist(),
                      "tokens_from": "decode_tokens" if given is not None else f"the reference's greedy choice ({ref.name})",
                      "kv_cache": kv_rows(ctx, ref_run, alt_run, cal_run, noise),
                      "calibration_noise": noise.record(steps),
                      "token_metrics": token_rows(ctx, ref_run, alt_run, cal_run),
                      "seconds_per_step": {side: _per_step(run) for side, run in
                                           (("reference", ref_run), ("alternative", alt_run)) if run is not None}}
        if plan.config.isolate:  # the layer of a first divergence at a decode step, replayed at that step
            replay_decode_layer(ctx, ref_run, np.asarray(tokens), cal)
        if plan.config.drill_down:  # what the drill-down gives a layer at the first divergent step
            ctx.decode_inputs = step_inputs(ctx, ref_run, np.asarray(tokens))

    @staticmethod
    def _calibration(ctx: RunContext, steps: int, taps: list[CheckpointKey],
                     tokens: np.ndarray) -> tuple[DecodeRun | None, Backend | None]:
        """The calibration's decode of the same tokens, and the backend that ran it: the session's calibration backend where it
        decodes, else the model's own eager code at the calibration's dtype (``float64_eager``'s)."""
        if not ctx.plan.config.calibrate or not any(ctx.plan.calibrated(k) for k in ctx.plan.keys):
            return None, None
        cal = ctx.calibrator
        if cal is None or not decode_support(cal)[0]:
            from ...backends.eager_reference import EagerReferenceBackend

            cal = EagerReferenceBackend()
            dtype = calibration_dtype(ctx.plan, ctx.model)
            ctx.prepare_backend(cal, "calibration", dtype, "cpu")
        return call_backend(cal, "run_decode()", lambda: cal.run_decode(own(ctx.inputs), steps, taps, own(tokens))), cal  # type: ignore[attr-defined]


def ev_module(ctx: RunContext, key: CheckpointKey) -> str | None:
    """The module path the prefill's evidence names for ``key``."""
    found = ctx.evidence.at(key)
    return None if found is None else found.module


def _missing(key: CheckpointKey, step: int, side: str, tol: Tolerance) -> ComparisonResult:
    return ComparisonResult(passed=False, reason=f"the {side} backend produced no tensor for {key} at decode step {step}",
                            tolerance=tol, name=f"{key}@{step}")


def _per_step(run: DecodeRun) -> float | None:
    times = [c.elapsed_s for c in run.captures[1:]]
    return sum(times) / len(times) if times else None


def kv_rows(ctx: RunContext, ref: DecodeRun, alt: DecodeRun, cal: DecodeRun | None,
            carry: NoiseCarry | None = None) -> list[JsonObject]:
    """The KV cache after each pass (step 0: the prefill), per layer: K and V of the alternative
    against the reference (padded positions left out), beside the calibration's where it decoded;
    each also added to the evidence (:class:`~.evidence.KVEvidence`, for the judge). What each
    side kept is compared (:attr:`~debug_framework.backends.decode.DecodeRun.kv_span`): the whole
    cache after the prefill and on audited steps, else the trailing positions both kept (a step's
    new entries); the row's ``compared`` says which. With ``carry``, the calibration's noise on a
    step's new entries is measured as :class:`NoiseCarry` measures a checkpoint's (a whole cache's
    always). Empty where a side does not expose its cache."""
    rows: list[JsonObject] = []
    for s, (rk, ak) in enumerate(zip(ref.kv_cache, alt.kv_cache)):
        mask = ref.attention_masks[s] if s < len(ref.attention_masks) else None
        ck = cal.kv_cache[s] if cal is not None and s < len(cal.kv_cache) else {}
        for layer in sorted(set(rk) & set(ak)):
            row: JsonObject = {"step": s, "layer": layer}
            for j, part in enumerate(("k", "v")):
                r, a, m = held_by_both(rk[layer][j], ak[layer][j], _trailing(mask, rk[layer][j]))
                row["compared"] = _compared(s, r, ref, alt, layer)
                err = compare(r, a, check_dtype=False, positions=m)
                c = held_by_both(r, ck[layer][j], m) if layer in ck else None
                scale = reference_scale(select_positions(r, position_mask(m)))  # m: an attention mask
                noise = None
                if c is not None:
                    def measure(c: tuple[CapturedTensor, CapturedTensor, np.ndarray | None] = c) -> ComparisonResult:
                        return compare(c[0], c[1], check_dtype=False, positions=c[2])
                    whole = carry is None or row["compared"] != "new entries"
                    noise = measure() if whole else carry.kv(  # type: ignore[union-attr]
                        ctx, KVEvidence(s, layer, part, err, None, scale), measure,
                        noise_sampled(s, len(ref.kv_cache) - 1))
                ctx.evidence.kv_cache.append(KVEvidence(s, layer, part, err, noise, scale))
                row[part] = {"rmse": err.rmse, "max_abs_error": err.max_abs_error, "reference_rms": scale,
                             "noise_rmse": None if noise is None else error_metric(noise, "rmse"),
                             "shape_match": err.shape_match}
            rows.append(row)
    return rows


def _trailing(mask: np.ndarray | None, kept: CapturedTensor) -> np.ndarray | None:
    """The mask's trailing columns over the positions a side kept (all of them for a whole cache,
    the last for a step's new entries)."""
    shape = getattr(kept, "shape", ())
    if mask is None or len(shape) < 2 or int(shape[1]) >= mask.shape[1]:
        return mask
    return mask[:, mask.shape[1] - int(shape[1]):]


def _compared(step: int, kept: CapturedTensor, ref: DecodeRun, alt: DecodeRun, layer: int) -> str:
    """What a KV row compared: ``"new entries"`` (the step's last positions) or the whole cache,
    and why (``"prefill"``, ``"audit"``, ``"rewrite"``)."""
    spans = {run.span(step, layer) for run in (ref, alt)}
    if step and int(getattr(kept, "shape", (0, 0))[1]) <= KV_TAIL and "new" in spans:
        return "new entries"
    return "whole cache (" + "/".join(sorted(spans - {"new"})) + ")"


class NoiseCarry:
    """The calibration's noise at the decode steps, measured where it must be and carried between:
    at a sampled step (:func:`noise_sampled`) it is measured; at any other, the last one measured
    for the same checkpoint (or the same layer's K or V new entries) is carried, and where the
    check fails by the carried bound the noise is measured at that step and judges it instead (so a
    carried bound never fails a correct step, and a failure is judged by its own step's noise).
    Counts what was measured and carried for ``result.decode["calibration_noise"]``."""

    def __init__(self) -> None:
        self.last: dict[tuple[object, ...], ComparisonResult] = {}
        self.measured = self.carried = self.remeasured = 0

    def _noise(self, slot: tuple[object, ...], measure: Callable[[], ComparisonResult | None], sampled: bool,
               fails: Callable[[ComparisonResult], bool]) -> ComparisonResult | None:
        held = None if sampled else self.last.get(slot)
        if held is not None and not fails(held):
            self.carried += 1
            return held
        noise = measure()
        self.measured += 1
        self.remeasured += held is not None
        if noise is not None:
            self.last[slot] = noise
        return noise

    def checkpoint(self, ctx: RunContext, ev: CheckpointEvidence, measure: Callable[[], ComparisonResult | None],
                   sampled: bool) -> None:
        """Set ``ev.noise`` (a decode step's checkpoint)."""
        def fails(noise: ComparisonResult) -> bool:
            ev.noise = noise
            return not judge_checkpoint(ev, ctx.evidence, ctx.plan).passed
        ev.noise = self._noise(("checkpoint", ev.key), measure, sampled, fails)

    def kv(self, ctx: RunContext, ev: KVEvidence, measure: Callable[[], ComparisonResult | None],
           sampled: bool) -> ComparisonResult | None:
        """The noise of ``ev`` (a step's new K or V entries of a layer; its own ``noise`` unused)."""
        return self._noise(("kv", ev.layer, ev.part), measure, sampled,
                           lambda noise: not judge_kv(replace(ev, noise=noise), ctx.plan).passed)

    def record(self, steps: int) -> JsonObject:
        """Where the noise was measured and how it was carried (the bound's provenance)."""
        return {"sampled_steps": [s for s in range(1, steps + 1) if noise_sampled(s, steps)],
                "every": NOISE_EVERY, "measured": self.measured, "carried": self.carried,
                "remeasured": self.remeasured,
                "rule": "measured at step 1, every NOISE_EVERY-th step and the last; between them the last measured "
                        "noise of the same checkpoint (or K/V new entries) is carried, and measured at the step "
                        "itself where the check fails by the carried bound"}


#: the logits checkpoint the token-level metrics read
_LOGITS = CheckpointKey("post_processing")
#: how many top-1 flips a token_metrics row lists (``flip_count`` counts them all)
_FLIPS_SHOWN = 8


def token_rows(ctx: RunContext, ref: DecodeRun, alt: DecodeRun, cal: DecodeRun | None) -> list[JsonObject]:
    """The next-token distributions of every pass (step 0: the prefill's token positions, padded
    ones left out; step s: each row's new token), the alternative's against the reference's beside
    the calibration's (:func:`~debug_framework.comparison.next_token.next_token_metrics`); each also
    added to the evidence (:class:`~.evidence.TokenEvidence`, for the judge). Empty where the logits
    (``post_processing``) are not a checkpoint of the session."""
    rows: list[JsonObject] = []
    if _LOGITS not in ctx.plan.keys:
        return rows
    for s, (r, a) in enumerate(zip(ref.captures, alt.captures)):
        if _LOGITS not in r or _LOGITS not in a or tuple(r[_LOGITS].shape) != tuple(a[_LOGITS].shape):
            continue  # a missing or misshapen tensor already fails the checkpoint itself
        mask = position_mask(ref.attention_masks[0]) if s == 0 and ref.attention_masks else None
        metrics = next_token_metrics(r[_LOGITS], a[_LOGITS], positions=mask)
        c = None if cal is None or s >= len(cal.captures) else cal.captures[s]
        calm, noise = None, math.nan
        if c is not None and _LOGITS in c and tuple(c[_LOGITS].shape) == tuple(r[_LOGITS].shape):
            calm = next_token_metrics(r[_LOGITS], c[_LOGITS], positions=mask)
            noise = error_metric(compare(r[_LOGITS], c[_LOGITS], check_dtype=False, positions=mask), "max_abs_error")
        ctx.evidence.token_metrics.append(TokenEvidence(s, metrics, calm, noise,
                                                        reference_scale(select_positions(r[_LOGITS], mask))))
        row = metrics.to_dict()
        row["flip_count"] = len(metrics.flips)
        row["flips"] = row["flips"][:_FLIPS_SHOWN]
        row["calibration"] = None if calm is None else {
            "kl_divergence": dict(calm.kl_divergence), "top1_agreement": calm.top1_agreement,
            "logits_max_abs_error": noise}
        rows.append({"step": s, **row})
    return rows


def held_by_both(ref: CapturedTensor, alt: CapturedTensor, mask: np.ndarray | None
                 ) -> tuple[CapturedTensor, CapturedTensor, np.ndarray | None]:
    """A layer's cache ``[batch, length, ...]`` on both sides cut to the trailing positions both
    hold: an engine that evicts what left a sliding window keeps only the last ones (Hugging Face's
    sliding layers keep ``window - 1``), a reference keeps every position. Equal lengths: unchanged."""
    lr, la = (int(getattr(t, "shape", (0, 0))[1]) if len(getattr(t, "shape", ())) > 1 else 0 for t in (ref, alt))
    if lr == la or not lr or not la:
        return ref, alt, mask
    n = min(lr, la)
    return ref[:, lr - n:], alt[:, la - n:], None if mask is None else mask[:, mask.shape[1] - n:]
