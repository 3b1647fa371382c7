"""The served stage: a model behind an OpenAI-compatible endpoint, measured by its tokens
(docs/served.md).

A served model gives out no hidden states, only the top-k log-probabilities of the next token. The
stage measures, teacher-forced, every position of each row's prompt (step 0, as the prefill's logits)
and ``decode_steps`` continuation tokens (the reference's greedy choice, or ``decode_tokens``):

1. the reference (float64 here): its logits at every prompt position and, decoding, at each step;
2. the calibration: the trusted implementation at the precision the user names (``--dtype``) on the
   same tokens: what a correct run at that precision gives;
3. the endpoint: each row's tokens sent as ids, the top-k asked at every position
   (:meth:`~debug_framework.backends.endpoints.LogprobBackend.run_logprobs`, the engine the registry
   names for the server's API);
4. per pass, the evidence the judge reads as it reads any decode: :class:`~.evidence.TokenEvidence`
   (KL over the returned top-k, Δp of the reference's token, top-1/top-k agreement: the
   endpoint's beside the calibration's seen through the same top-k window) and the
   ``post_processing`` checkpoint at that step: the returned log-probabilities against the
   reference's at the same tokens, the calibration's error there its noise. Where the prefill fails,
   correct runs at the lower precisions give ``consistent_with``.

An endpoint failing mid-run keeps what it answered: the passes measured go into the evidence (and
the rows) before its error is raised.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import numpy as np

from ...backends.decode import DecodeRun, decode_support
from ...capture.keys import Capture, CheckpointKey
from ...comparison import compare
from ...comparison.topk import log_probs_at, top_of, topk_token_metrics
from ...backends.capabilities import offers
from ...backends.endpoints import LogprobBackend, LogprobRun, LogprobRunCut
from ...errors import BackendInitializationError, ConfigurationError
from ...jsonio import JsonObject
from ...measure import Timer
from ...models.session_config import SessionConfig
from .calibration import calibration_backend, calibration_dtype
from .context import RunContext, Stage, call_backend, own
from .decode_stage import check_decode_plan
from .evidence import CheckpointEvidence, TokenEvidence, reference_scale
from .precision_stage import PrecisionTrials, lower_precision_backend

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...modelio import ModelInputs

__all__ = ["ServedStage", "served_sequences", "served_alternative", "Pass"]

#: the logits checkpoint: a served model's only one
LOGITS = CheckpointKey("post_processing")
#: how many top-1 flips a token_metrics row lists (``flip_count`` counts them all)
_FLIPS_SHOWN = 8


def served_alternative(requested: str) -> str:
    """The alternative backend of a session with ``alternative_endpoint``: the registry's engine for
    OpenAI-compatible servers (:func:`~debug_framework.backends.registry.endpoint_engine`), where
    ``requested`` is it or ``auto`` (ConfigurationError, DF005, for another name; DF002 where no
    engine is registered for them)."""
    from ...backends.registry import endpoint_engine

    record = endpoint_engine("openai")
    if record is None:
        raise BackendInitializationError("no registered engine validates a model behind an OpenAI-compatible server",
                                         backend=requested, hint="register one with endpoint_apis=('openai',)")
    if requested not in ("auto", record.name):
        raise ConfigurationError(f"--alternative-endpoint validates a served model; --alternative-backend {requested} "
                                 "names another", hint=f"drop --alternative-backend (or give {record.name!r})")
    return record.name


def served_sequences(inputs: ModelInputs, tokens: np.ndarray) -> tuple[list[tuple[int, ...]], list[np.ndarray]]:
    """Each row's sequence as the endpoint is sent it (its tokens, padding left out, then its decode
    ``tokens``) and where its prompt tokens are in the padded inputs (their indices)."""
    ids = np.asarray(inputs.input_ids)
    mask = inputs.attention_mask
    sequences, where = [], []
    for b in range(ids.shape[0]):
        idx = np.flatnonzero(np.asarray(mask[b]) != 0) if mask is not None else np.arange(ids.shape[1])
        sequences.append(tuple(int(t) for t in ids[b, idx]) + tuple(int(t) for t in np.asarray(tokens)[b]))
        where.append(idx)
    return sequences, where


class Pass:
    """One pass's places: step 0 every prompt position of every row, step s each row's s-th token.
    ``places[i]`` is ``(row, position in the row's sequence)``, ``index[i]`` its logits index."""

    def __init__(self, step: int, where: list[np.ndarray]) -> None:
        self.step = step
        self.places: list[tuple[int, int]] = []
        self.index: list[tuple[int, ...]] = []
        for b, idx in enumerate(where):
            if step == 0:
                self.places += [(b, j) for j in range(len(idx))]
                self.index += [(b, int(i)) for i in idx]
            else:
                self.places.append((b, len(idx) - 1 + step))
                self.index.append((b,))

    def logits(self, run: DecodeRun) -> np.ndarray:
        """``[places, vocab]``: the run's logits at this pass's places."""
        x = np.asarray(_numpy(run.captures[self.step][LOGITS]), dtype=np.float64)
        if self.step == 0:
            return np.stack([x[i] for i in self.index]) if self.index else x.reshape(0, x.shape[-1])
        return x.reshape(x.shape[0], -1, x.shape[-1])[:, -1]


def _numpy(x: object) -> np.ndarray:
    detach = getattr(x, "detach", None)
    if callable(detach):
        return detach().cpu().double().numpy()  # type: ignore[no-any-return,union-attr]
    return np.asarray(x)


class ServedStage(Stage):
    """The served model's tokens measured against the reference's, beside a correct run's (see the module)."""

    name = "served"
    timing_key = "served_s"
    reads_hidden_states = False

    def applies(self, config: SessionConfig) -> bool:
        return config.alternative_endpoint is not None

    def run(self, ctx: RunContext) -> None:
        served = self._served_backend(ctx)
        steps = ctx.plan.config.decode_steps
        given = check_decode_plan(ctx.plan.config, ctx.inputs, ctx.model)
        ref_run = self._reference(ctx, steps, given)
        tokens = np.asarray(ref_run.tokens if given is None else given,
                            dtype=np.int64).reshape(len(ctx.inputs.input_ids), steps)
        cal_run = self._calibration(ctx, steps, tokens)
        sequences, where = served_sequences(ctx.inputs, tokens)
        passes = [Pass(s, where) for s in range(steps + 1)]
        wanted = [tuple(sorted({p for ps in passes for (b, p) in ps.places if b == row})) for row in range(len(sequences))]
        try:
            run: LogprobRun = call_backend(ctx.alternative, "run_logprobs()",
                                           lambda: served.run_logprobs(sequences, wanted))
        except LogprobRunCut as exc:
            if exc.measured is not None:  # a partial run keeps what it measured
                self._record(ctx, passes, ref_run, cal_run, exc.measured, tokens, given, exc.message)
            raise
        self._record(ctx, passes, ref_run, cal_run, run, tokens, given, None)
        prefill = ctx.judge().checkpoints.get(LOGITS)
        if prefill is not None and not prefill.passed:
            self._lower_precisions(ctx, passes[0], ref_run, run)

    @staticmethod
    def _served_backend(ctx: RunContext) -> LogprobBackend:
        """The alternative as a backend of log-probabilities (DF002 where it gives none), the session
        checked for what a served model can answer (DF005), its endpoint noted in the evidence."""
        if ctx.plan.config.position_offset:
            raise ConfigurationError("a served model's sequences start at position 0: position_offset must be 0",
                                     hint="drop position_offset (the endpoint is sent each row's tokens from the start)")
        backend = ctx.alternative
        if not offers(backend, "run_logprobs"):
            raise BackendInitializationError(f"the alternative backend {backend.name!r} gives out no token "
                                             "log-probabilities (no run_logprobs)", backend=backend.name,
                                             hint="alternative_endpoint needs an engine registered for the server's API")
        served = cast(LogprobBackend, backend)
        ctx.evidence.served = str(getattr(served, "url", backend.name))
        ctx.evidence.isolation_note = "a served model gives out no hidden states: no layer to isolate"
        return served

    def _reference(self, ctx: RunContext, steps: int, given: np.ndarray | None) -> DecodeRun:
        """The reference's logits at the prompt and, decoding, its greedy tokens and each step's logits."""
        with Timer() as t:
            run = self._logits(ctx, ctx.reference, steps, given)
        ctx.performance["reference"] = {"backend": ctx.reference.name, "dtype": ctx.plan.reference_dtype,
                                        "device": ctx.plan.config.reference_device, "wall_s": t.seconds}
        return run

    # ------------------------------------------------------------------ the local runs

    @staticmethod
    def _logits(ctx: RunContext, backend: Backend, steps: int, tokens: np.ndarray | None) -> DecodeRun:
        """``backend``'s logits at the prefill (and, with ``steps``, each decode step on ``tokens``)."""
        if not steps:
            cap: Capture = call_backend(backend, "run()", lambda: backend.run(own(ctx.inputs), [LOGITS]))
            return DecodeRun([cap], np.zeros((len(ctx.inputs.input_ids), 0), dtype=np.int64))
        ok, why = decode_support(backend)
        if not ok:
            raise ConfigurationError(f"the backend {backend.name!r} {why}", backend=backend.name,
                                     hint="use a reference that decodes (python_reference, float64_eager), or set "
                                          "decode_steps to 0")
        return call_backend(backend, "run_decode()",  # type: ignore[no-any-return]
                            lambda: backend.run_decode(own(ctx.inputs), steps, [LOGITS], own(tokens)))  # type: ignore[attr-defined]

    def _calibration(self, ctx: RunContext, steps: int, tokens: np.ndarray) -> DecodeRun | None:
        """The trusted implementation at the named precision on the same tokens (None: calibration off)."""
        plan = ctx.plan
        if not plan.config.calibrate or not plan.calibrated(LOGITS):
            return None
        cal = ctx.prebuilt.calibrator if ctx.prebuilt is not None else None
        cal = cal or calibration_backend(plan, "served", ctx.model)
        dtype = calibration_dtype(plan, ctx.model)
        if steps and not decode_support(cal)[0]:
            from ...backends.eager_reference import EagerReferenceBackend

            cal = EagerReferenceBackend()
        with Timer() as t:
            ctx.prepare_backend(cal, "calibration", dtype, "cpu")
            run = self._logits(ctx, cal, steps, tokens)
        ctx.calibrator = cal
        ctx.performance["calibration"] = {"backend": cal.name, "dtype": dtype, "device": "cpu", "wall_s": t.seconds}
        return run

    # ------------------------------------------------------------------ the evidence

    def _record(self, ctx: RunContext, passes: list[Pass], ref_run: DecodeRun, cal_run: DecodeRun | None,
                run: LogprobRun, tokens: np.ndarray, given: np.ndarray | None, error: str | None) -> None:
        """Each pass the endpoint answered at all of its places, measured into the evidence, and the
        ``decode`` record every view shows."""
        rows: list[JsonObject] = []
        for ps in passes:
            if not ps.places or any(place not in run.top for place in ps.places):
                continue  # not (wholly) answered: nothing judged there
            rows.append(self._measure(ctx, ps, ref_run, cal_run, run))
        backend = ctx.alternative
        endpoint: JsonObject = {"url": getattr(backend, "url", None), **run.to_dict(),
                                "asked": sum(len(ps.places) for ps in passes), "partial": error is not None}
        if error is not None:
            endpoint["error"] = error
        ctx.performance["alternative"] = {"backend": backend.name, "dtype": ctx.plan.alternative_dtype,
                                          "device": "remote", "wall_s": run.seconds, "requests": run.requests}
        ctx.decode = {"steps": len(passes) - 1, "tokens": tokens.tolist(),
                      "tokens_from": "decode_tokens" if given is not None else
                      f"the reference's greedy choice ({ctx.reference.name})",
                      "kv_cache": [], "token_metrics": rows, "served": endpoint}

    def _measure(self, ctx: RunContext, ps: Pass, ref_run: DecodeRun, cal_run: DecodeRun | None,
                 run: LogprobRun) -> JsonObject:
        """One pass: its token metrics and its ``post_processing`` checkpoint, into the evidence."""
        plan = ctx.plan
        k = min(len(run.top[place].ids) for place in ps.places)
        ids = np.stack([run.top[place].ids[:k] for place in ps.places])
        lp = np.stack([run.top[place].logprobs[:k] for place in ps.places])
        ref = ps.logits(ref_run)
        metrics = topk_token_metrics(ref, ids, lp, ps.index)
        ref_at = log_probs_at(ref, ids)
        calm, noise_abs, noise = None, math.nan, None
        if cal_run is not None:
            cal = ps.logits(cal_run)
            cal_ids, cal_lp = top_of(cal, k)
            calm = topk_token_metrics(ref, cal_ids, cal_lp, ps.index)
            finite = np.isfinite(ref) & np.isfinite(cal)
            noise_abs = float(np.max(np.abs(cal - ref)[finite])) if finite.any() else math.nan
            noise = compare(ref_at, log_probs_at(cal, ids), check_dtype=False, name=f"{LOGITS} (calibration)")
        ctx.evidence.token_metrics.append(TokenEvidence(ps.step, metrics, calm, noise_abs, reference_scale(ref)))
        name = str(LOGITS) if ps.step == 0 else f"{LOGITS}@{ps.step}"
        ctx.evidence.checkpoints.append(CheckpointEvidence(
            key=LOGITS, step=ps.step, reference_rms=reference_scale(ref_at), noise=noise,
            comparison=compare(ref_at, lp, tolerance=plan.tolerance(LOGITS), check_dtype=False, name=name),
            module="the served model's log-probabilities at its top-k tokens"))
        row = metrics.to_dict()
        row["flip_count"] = len(metrics.flips)
        row["flips"] = row["flips"][:_FLIPS_SHOWN]
        row["calibration"] = None if calm is None else {
            "kl_divergence": dict(calm.kl_divergence), "top1_agreement": calm.top1_agreement,
            "logits_max_abs_error": noise_abs}
        return {"step": ps.step, **row}

    @staticmethod
    def _lower_precisions(ctx: RunContext, prefill: Pass, ref_run: DecodeRun, run: LogprobRun) -> None:
        """Where the prefill fails: correct runs at each lower precision, their log-probabilities at
        the returned tokens against the reference's (the judge's ``consistent_with``)."""
        plan = ctx.plan
        ev = next((e for e in ctx.evidence.checkpoints if e.step == 0), None)
        if ev is None or not plan.lower_precisions or not plan.config.precision_diagnosis:
            return
        k = min(len(run.top[place].ids) for place in prefill.places)
        ids = np.stack([run.top[place].ids[:k] for place in prefill.places])
        ref_at = log_probs_at(prefill.logits(ref_run), ids)
        trials = PrecisionTrials()
        candidates = [(d, d, lambda d=d: lower_precision_backend(plan.config.calibration_backend, d))
                      for d in plan.lower_precisions]
        for dtype, low in trials.runs(ctx, candidates, lambda b: ServedStage._logits(ctx, b, 0, None)):
            ev.lower_precision = {**(ev.lower_precision or {}), dtype: compare(
                ref_at, log_probs_at(prefill.logits(low), ids), check_dtype=False, name=f"{LOGITS} ({dtype})")}
        ctx.evidence.precision_note = trials.note(plan.config.calibration_backend)
