"""Each decode pass judged as it is produced (docs/validation.md, "Decode steps").

:class:`DecodeWalk` takes the reference's and the alternative's pass of one step
(:class:`~debug_framework.backends.decode.DecodePass`), measures it (every checkpoint and the KV
cache's new entries in one vectorised pass, :func:`.decode_batch.measure_many`; the whole cache on
an audited step; the next-token distributions) beside the calibration's noise (measured by its own
pass at the step or carried, :mod:`.decode_calibration`) into the evidence, judges the step, and
drops the tensors: what a step leaves behind is its comparisons (numbers), so memory does not grow
with the tensors of the steps taken. It keeps only what a failure needs: the reference's pass at
the first divergent step and its cache before that step (for the replays and the drill-down), and
the running cache itself (the reference's last whole cache and the new entries since).

:meth:`DecodeWalk.step_many` takes the passes of several consecutive steps (the steps of one
reference pass over several): it measures all of them at once (one :func:`.decode_batch.measure_many`,
each step a part of its own; one :func:`~debug_framework.comparison.next_token.next_token_metrics_many`),
then judges each in order exactly as :meth:`DecodeWalk.step` judges one, which is ``step_many`` of
one pass: one path of judgement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ...backends.decode import KV_TAIL, DecodePass, DecodeRun, LayerKV, concat_positions
from ...capture.keys import Capture, CapturedTensor, CheckpointKey
from ...comparison import ComparisonResult, Tolerance, compare, error_metric, position_mask, select_positions
from ...comparison.engine import in_full_tensor
from ...comparison.positions import applies_to
from ...comparison.next_token import TokenMetrics, next_token_metrics, next_token_metrics_many
from ...jsonio import JsonObject
from .calibration import noise_at
from .context import RunContext
from .decode_batch import Pair, compare_many, measure_many
from .decode_calibration import NOISE_EVERY, CalibrationPasses, NoiseCarry, noise_sampled
from .evidence import CheckpointEvidence, KVEvidence, TokenEvidence, reference_scale
from .judge import checkpoint_passes, judge_tokens, kv_passes

__all__ = ["DecodeWalk", "NoiseCarry", "NOISE_EVERY", "noise_sampled", "held_by_both", "LOGITS"]

#: the logits checkpoint the token-level metrics read
LOGITS = CheckpointKey("post_processing")
#: how many top-1 flips a token_metrics row lists (``flip_count`` counts them all)
_FLIPS_SHOWN = 8


#: one layer's K or V as a step compares it: layer, part, reference, alternative, mask, what was compared
_KVPlan = tuple[int, str, CapturedTensor, CapturedTensor, np.ndarray | None, str]


class _Measured(NamedTuple):
    """What one pass measured before it is judged (:meth:`DecodeWalk._measure`): the checkpoints
    both sides hold (none at the prefill), its K/V plans, each checkpoint's comparison and
    reference RMS, those of the K/V new entries measured with them (by plan index) and the
    next-token metrics (None: not measured)."""

    keys: list[CheckpointKey]
    kv: list[_KVPlan]
    errors: dict[CheckpointKey, ComparisonResult]
    scales: dict[CheckpointKey, float]
    kv_errors: dict[int, ComparisonResult]
    kv_scales: dict[int, float]
    tokens: TokenMetrics | None


class _CacheTrail:
    """The reference's cache as the passes go: per layer the last whole cache kept and the new
    entries (each pass's own position) since; :meth:`whole` joins them."""

    def __init__(self) -> None:
        self.base: dict[int, LayerKV] = {}
        self.tail: dict[int, list[LayerKV]] = {}

    def add(self, p: DecodePass) -> None:
        for layer, kv in p.kv.items():
            if p.span.get(layer, "audit") == "new" and layer in self.base:
                self.tail[layer].append((kv[0][:, -1:], kv[1][:, -1:]))
            else:
                self.base[layer], self.tail[layer] = kv, []

    def whole(self) -> dict[int, LayerKV]:
        """Every layer's whole cache now (as :meth:`DecodeRun.cache_at` joins a whole cache and the
        new entries after it)."""
        out: dict[int, LayerKV] = {}
        for layer, kv in self.base.items():
            parts = [kv, *self.tail.get(layer, [])]
            out[layer] = (concat_positions([p[0] for p in parts]), concat_positions([p[1] for p in parts]))
        return out


class DecodeWalk:
    """The decode stage's judgement, one step at a time (see the module). ``steps`` is the number
    of decode steps asked for; :attr:`first_failed` the first decode step whose checkpoints fail
    (None while none has), :attr:`kv_rows` and :attr:`token_rows` the rows of
    ``result.decode``."""

    def __init__(self, ctx: RunContext, steps: int, calibration: CalibrationPasses | None) -> None:
        self.ctx, self.steps, self.calibration = ctx, steps, calibration
        self.carry = NoiseCarry()
        self.kv_rows: list[JsonObject] = []
        self.token_rows: list[JsonObject] = []
        self.first_failed: int | None = None
        #: the reference's pass at :attr:`first_failed`, and its whole cache before that step
        self.kept: DecodeRun | None = None
        self._trail = _CacheTrail()
        #: the calibration's next-token metrics and largest logit error last measured (carried between)
        self._token_noise: tuple[TokenMetrics | None, float] = (None, math.nan)
        #: the module path the prefill's evidence names for each checkpoint (:func:`_module`), looked up once
        self._modules: dict[CheckpointKey, str | None] = {}
        self._seconds: dict[str, list[float]] = {"reference": [], "alternative": []}

    def step(self, r: DecodePass, a: DecodePass) -> bool:
        """Measure and judge one pass (step 0: the prefill's KV cache and logits; its checkpoints
        are the compare stage's); True where a decode step's checkpoints fail. The calibration's
        pass at the step is run only where a noise is measured (:class:`~.decode_calibration.NoiseCarry`).
        One pass of :meth:`step_many`."""
        return self.step_many([(r, a)], False)[0]

    def step_many(self, pairs: Sequence[tuple[DecodePass, DecodePass]], stop: bool) -> list[bool]:
        """Measure and judge the passes ``pairs`` (the reference's and the alternative's pass of
        consecutive steps, e.g. the steps of one reference pass over several): every step's
        comparisons in one vectorised pass (its checkpoints and its K/V new entries,
        :func:`.decode_batch.measure_many`; its next-token metrics,
        :func:`~debug_framework.comparison.next_token.next_token_metrics_many`), then each step
        judged in order as :meth:`step` judges it alone (the same evidence, rows and carried
        noise). Returns each judged step's failed flag; with ``stop`` the judgement ends after the
        first failing step (the steps after it are neither judged nor recorded: the list is shorter)."""
        out: list[bool] = []
        for (r, a), m in zip(pairs, self._measure(pairs)):
            out.append(self._judge(r, a, m))
            if out[-1] and stop:
                break
        return out

    def _measure(self, pairs: Sequence[tuple[DecodePass, DecodePass]]) -> list[_Measured]:
        """What each pass of ``pairs`` measures before it is judged, every pass's at once."""
        plan = self.ctx.plan
        checkpoints: list[Pair] = []
        entries: list[Pair] = []
        parts: tuple[list[int], list[int]] = ([], [])
        layout: list[tuple[list[CheckpointKey], list[_KVPlan], list[int], int, int]] = []
        for i, (r, a) in enumerate(pairs):
            s = r.step
            held_r, held_a = r.capture.tensors, a.capture.tensors  # the plan's keys are valid: looked up as they are
            keys = [k for k in plan.keys if k in held_r and k in held_a] if s else []
            kv = self._kv_plans(s, r, a)
            batched = [j for j, p in enumerate(kv) if p[5] == "new entries" and (p[4] is None or bool(np.all(p[4])))]
            layout.append((keys, kv, batched, len(checkpoints), len(entries)))
            checkpoints += [Pair(held_r[k], held_a[k], plan.tolerance(k), f"{k}@{s}") for k in keys]
            entries += [Pair(kv[j][2], kv[j][3], None, "") for j in batched]
            parts[0].extend([i] * len(keys))
            parts[1].extend([i] * len(batched))
        # every comparison of the passes in one vectorised pass: the checkpoints, then the new K/V
        # entries (each kind's tensors of one shape side by side: stacked as one run)
        results, scales = measure_many(checkpoints + entries, parts[0] + parts[1])
        tokens = self._token_metrics(pairs)
        out: list[_Measured] = []
        n0 = len(checkpoints)
        for (keys, kv, batched, c, e), metrics in zip(layout, tokens):
            c1, e0 = c + len(keys), n0 + e
            e1 = e0 + len(batched)
            out.append(_Measured(keys, kv, dict(zip(keys, results[c:c1])), dict(zip(keys, scales[c:c1])),
                                 dict(zip(batched, results[e0:e1])), dict(zip(batched, scales[e0:e1])), metrics))
        return out

    def _token_metrics(self, pairs: Sequence[tuple[DecodePass, DecodePass]]) -> list[TokenMetrics | None]:
        """Each pass's next-token metrics, the alternative's logits against the reference's (None
        where the logits are not a checkpoint, or a side lacks them or has them of another shape:
        the checkpoint itself fails then); the decode steps' at once, the prefill's over its
        token positions."""
        out: list[TokenMetrics | None] = [None] * len(pairs)
        stacked: list[int] = []
        for i, (r, a) in enumerate(pairs):
            held_r, held_a = r.capture.tensors, a.capture.tensors
            if LOGITS not in self.ctx.plan.keys or LOGITS not in held_r or LOGITS not in held_a \
                    or tuple(held_r[LOGITS].shape) != tuple(held_a[LOGITS].shape):
                continue
            if r.step:
                stacked.append(i)
            else:
                out[i] = next_token_metrics(held_r[LOGITS], held_a[LOGITS], positions=position_mask(r.mask))
        got = next_token_metrics_many([(pairs[i][0].capture.tensors[LOGITS], pairs[i][1].capture.tensors[LOGITS])
                                       for i in stacked])
        for i, metrics in zip(stacked, got):
            out[i] = metrics
        return out

    def _judge(self, r: DecodePass, a: DecodePass, m: _Measured) -> bool:
        """Judge one pass from what it measured (:meth:`_measure`), recording its evidence and rows;
        True where a decode step's checkpoints fail."""
        s = r.step
        if s:
            self._seconds["reference"].append(r.capture.elapsed_s)
            self._seconds["alternative"].append(a.capture.elapsed_s)
        failed = self._checkpoints(s, r.capture, a.capture, m.errors, m.scales) if s else False
        failed = self._tokens(s, r, m.tokens, m.scales.get(LOGITS)) and s > 0 or failed
        self._kv(s, m.kv, m.kv_errors, m.kv_scales)
        if failed and self.first_failed is None:
            self.first_failed = s
            self.carry.diverged(s)
            self.kept = self._keep(r)
        if self.first_failed is None:
            self._trail.add(r)
        return failed

    def _cal(self, s: int, why: str = "sampled") -> DecodePass | None:
        """The calibration's pass at step ``s`` (computed on the first ask: :meth:`CalibrationPasses.at`),
        None without one."""
        return None if self.calibration is None else self.calibration.at(s, why)

    def _cal_capture(self, s: int, why: str = "failed by the carried bound") -> Capture | None:
        got = self._cal(s, why)
        return None if got is None else got.capture

    def _may_measure(self, s: int) -> bool:
        return self.carry.may_measure(s, self.calibration)

    def seconds_per_step(self) -> dict[str, float]:
        return {side: sum(t) / len(t) for side, t in self._seconds.items() if t}

    def _keep(self, r: DecodePass) -> DecodeRun:
        """A :class:`DecodeRun` holding only what a replay at step ``r.step`` reads: the
        reference's capture there and its whole cache after the step before."""
        s = r.step
        empty = Capture(tensors={}, backend=r.capture.backend, dtype=r.capture.dtype)
        captures = [empty] * s + [r.capture]
        before = self._trail.whole()
        kv = [{} for _ in range(s - 1)] + [before]
        spans = [{} for _ in range(s - 1)] + [{layer: "audit" for layer in before}]
        return DecodeRun(captures, np.zeros((r.mask.shape[0], 0), np.int64), kv, [], spans)

    # -- checkpoints -------------------------------------------------------------------------------
    def _checkpoints(self, s: int, r: Capture, a: Capture, errors: dict[CheckpointKey, ComparisonResult],
                     scales: dict[CheckpointKey, float]) -> bool:
        """Judge decode step ``s``'s checkpoints (``errors`` and the reference's ``scales`` measured
        by :meth:`_measure`); True where one fails."""
        ctx, plan = self.ctx, self.ctx.plan
        keys = list(errors)
        sampled = noise_sampled(s, self.steps)
        measured: dict[CheckpointKey, ComparisonResult] = {}
        c = self._cal_capture(s, "sampled") if sampled else None
        if c is not None:
            noisy = [k for k in keys if plan.calibrated(k) and k in c]
            measured = dict(zip(noisy, compare_many([Pair(r[k], c[k], None, f"{k} (calibration)") for k in noisy])))
        failed = False
        modules = self._modules
        for key in plan.keys:
            module = modules[key] if key in modules else modules.setdefault(key, _module(ctx, key))
            if key in errors:
                ev = CheckpointEvidence(key=key, comparison=errors[key], step=s, module=module,
                                        reference_rms=scales[key])
            else:
                side = "alternative" if key not in a else "reference"
                ev = CheckpointEvidence(key=key, comparison=_missing(key, s, side, plan.tolerance(key)), step=s,
                                        module=module)
            judged = self._noise(ev, r, sampled, measured.get(key)) if key in errors and plan.calibrated(key) else None
            passed = judged if judged is not None else checkpoint_passes(ev, ctx.evidence, plan)
            if not passed and key in errors:  # the failure's evidence in full (worst elements, ULPs)
                ev.comparison = compare(r[key], a[key], tolerance=plan.tolerance(key), check_dtype=False,
                                        name=f"{key}@{s}")
                passed = checkpoint_passes(ev, ctx.evidence, plan)
            failed = failed or not passed
            ctx.evidence.checkpoints.append(ev)
        return failed

    def _noise(self, ev: CheckpointEvidence, r: Capture, sampled: bool,
               measured: ComparisonResult | None) -> bool | None:
        """Set ``ev.noise`` (:class:`NoiseCarry`); whether it passes by it where the carry judged it already."""
        ctx = self.ctx
        judged: list[tuple[ComparisonResult, bool]] = []

        def fails(noise: ComparisonResult) -> bool:
            ev.noise = noise
            judged.append((noise, checkpoint_passes(ev, ctx.evidence, ctx.plan)))
            return not judged[-1][1]
        s = ev.step or 0
        ev.noise = self.carry.noise(("checkpoint", ev.key), lambda: noise_at(ev.key, r, self._cal_capture(s)), sampled,
                                    fails, measured, lambda: self._may_measure(s))
        return judged[-1][1] if judged and judged[-1][0] is ev.noise else None

    # -- next-token distributions ------------------------------------------------------------------
    def _tokens(self, s: int, p: DecodePass, metrics: TokenMetrics | None, scale: float | None = None) -> bool:
        """The pass's next-token metrics row and evidence (``metrics``, measured by :meth:`_measure`;
        nothing where it is None: the logits are not a checkpoint, or a side lacks them); True where
        the token judgement fails. The calibration's metrics are measured where its noise is
        (:func:`noise_sampled`) and carried between as :class:`NoiseCarry` carries the noise:
        measured at the step itself where the pass fails by the carried ones."""
        ctx = self.ctx
        if metrics is None:
            return False  # a missing or misshapen tensor already fails the checkpoint itself
        r = p.capture
        mask = position_mask(p.mask) if s == 0 else None
        if scale is None or mask is not None:
            scale = reference_scale(select_positions(r[LOGITS], mask))

        def measure(why: str) -> tuple[TokenMetrics | None, float]:
            c = self._cal_capture(s, why)
            if c is None or LOGITS not in c or tuple(c[LOGITS].shape) != tuple(r[LOGITS].shape):
                return None, math.nan
            noise = compare_many([Pair(r[LOGITS], c[LOGITS], None, "")])[0] if mask is None else \
                compare(r[LOGITS], c[LOGITS], check_dtype=False, positions=mask)
            return next_token_metrics(r[LOGITS], c[LOGITS], positions=mask), error_metric(noise, "max_abs_error")

        held = None if s == 0 or noise_sampled(s, self.steps) else self._token_noise
        ev = None
        if held is not None and held[0] is not None:
            ev = TokenEvidence(s, metrics, held[0], held[1], scale)
            if not metrics.positions or judge_tokens(ev, ctx.plan).passed:
                self.carry.carried += 1
            elif self._may_measure(s):
                ev = None  # fails by the carried: measured at this step
                self.carry.remeasured += 1
            else:
                self.carry.carried_failing += 1
        if ev is None:
            self._token_noise = measure("sampled" if held is None else "failed by the carried bound")
            self.carry.measured += s > 0
            ev = TokenEvidence(s, metrics, *self._token_noise, scale)
        calm, noise = ev.calibration, ev.noise_max_abs
        ctx.evidence.token_metrics.append(ev)
        row = metrics.to_dict()
        row["flip_count"] = len(metrics.flips)
        row["flips"] = row["flips"][:_FLIPS_SHOWN]
        row["calibration"] = None if calm is None else {
            "kl_divergence": dict(calm.kl_divergence), "top1_agreement": calm.top1_agreement,
            "logits_max_abs_error": noise}
        self.token_rows.append({"step": s, **row})
        return calm is not None and bool(metrics.positions) and not judge_tokens(ev, ctx.plan).passed

    # -- the KV cache --------------------------------------------------------------------------------
    def _kv_plans(self, s: int, r: DecodePass, a: DecodePass) -> list[_KVPlan]:
        """What step ``s`` compares of each layer's K and V: ``(layer, part, reference, alternative,
        mask, compared)``, the trailing positions both sides hold (:func:`held_by_both`)."""
        plans: list[_KVPlan] = []
        for layer in sorted(set(r.kv) & set(a.kv)):
            for j, part in enumerate(("k", "v")):
                ref, alt, m = held_by_both(r.kv[layer][j], a.kv[layer][j], _trailing(r.mask, r.kv[layer][j]))
                plans.append((layer, part, ref, alt, m, _compared(s, ref, r, a, layer)))
        return plans

    def _kv(self, s: int, plans: list[_KVPlan], errors: dict[int, ComparisonResult], scales: dict[int, float]) -> None:
        """Each layer's K and V after the pass, the alternative's against the reference's beside the
        calibration's (:func:`held_by_both`; its noise carried as a checkpoint's): a step's new
        entries measured in :meth:`_measure`'s vectorised pass (``errors``, ``scales`` by plan; a
        masked step's new entries with ``compare``), a whole cache (the prefill, an audit, a
        rewrite) measured alone over its model positions (:func:`_measured`) and compared again in
        full where it fails (its worst elements and ULPs); each row's ``compared`` says which."""
        ctx = self.ctx
        layers = sorted({p[0] for p in plans})
        rows: dict[int, JsonObject] = {}
        sampled = noise_sampled(s, self.steps)
        for i, (layer, part, ref, alt, m, compared) in enumerate(plans):
            whole = compared != "new entries"  # measured alone (its stack would hold every layer's whole cache)
            if i in errors:
                err, scale = errors[i], scales[i]
            elif whole:
                err, scale = _measured(ref, alt, m)
            else:
                err = compare(ref, alt, check_dtype=False, positions=m)
                scale = reference_scale(select_positions(ref, position_mask(m)))
            noise = None
            if self.calibration is not None:
                j = 0 if part == "k" else 1

                def measure(ref: CapturedTensor = ref, m: np.ndarray | None = m, layer: int = layer, j: int = j,
                            why: str = "sampled" if sampled else "failed by the carried bound") -> ComparisonResult | None:
                    got = self._cal(s, why)
                    if got is None or layer not in got.kv:
                        return None
                    return _measured(*held_by_both(ref, got.kv[layer][j], m))[0]
                def fails(n: ComparisonResult, layer: int = layer, part: str = part, err: ComparisonResult = err,
                          scale: float = scale) -> bool:
                    return not kv_passes(KVEvidence(s, layer, part, err, n, scale), ctx.plan)
                noise = self.carry.noise(("kv", layer, part, compared == "new entries"), measure, sampled, fails,
                                         may_measure=lambda: self._may_measure(s))
            if whole and not kv_passes(KVEvidence(s, layer, part, err, noise, scale), ctx.plan):
                err = compare(ref, alt, check_dtype=False, positions=m)  # the failure's evidence in full (worst elements, ULPs)
            ctx.evidence.kv_cache.append(KVEvidence(s, layer, part, err, noise, scale))
            row = rows.setdefault(layer, {"step": s, "layer": layer, "compared": compared})
            row[part] = {"rmse": err.rmse, "max_abs_error": err.max_abs_error, "reference_rms": scale,
                         "noise_rmse": None if noise is None else error_metric(noise, "rmse"),
                         "shape_match": err.shape_match}
        self.kv_rows.extend(rows[layer] for layer in layers if layer in rows)


def _measured(ref: CapturedTensor, alt: CapturedTensor, mask: np.ndarray | None) -> tuple[ComparisonResult, float]:
    """A layer's whole K or V measured over the model positions ``mask`` selects by the vectorised
    measurement (:func:`.decode_batch.measure_many`, without ``compare``'s ULPs and quantiles), told
    against the whole tensor (shapes, worst elements' indices, positions left out) as ``compare``
    with ``positions`` tells it; and the reference's RMS over those positions, measured with it."""
    held = position_mask(mask)
    shape = tuple(getattr(ref, "shape", ()))
    if held is None or shape != tuple(getattr(alt, "shape", ())) or not applies_to(shape, held):
        results, scales = measure_many([Pair(ref, alt, None, "")])
        return results[0], scales[0]
    results, scales = measure_many([Pair(select_positions(ref, held), select_positions(alt, held), None, "")])
    return in_full_tensor(results[0], shape, held), scales[0]


def _module(ctx: RunContext, key: CheckpointKey) -> str | None:
    """The module path the prefill's evidence names for ``key`` (the prefill's evidence comes first)."""
    found = next((c for c in ctx.evidence.checkpoints if c.key == key or c.step), None)
    return None if found is None or found.step else found.module


def _missing(key: CheckpointKey, step: int, side: str, tol: Tolerance) -> ComparisonResult:
    return ComparisonResult(passed=False, reason=f"the {side} backend produced no tensor for {key} at decode step {step}",
                            tolerance=tol, name=f"{key}@{step}")


def _trailing(mask: np.ndarray | None, kept: CapturedTensor) -> np.ndarray | None:
    """The mask's trailing columns over the positions a side kept (all of them for a whole cache,
    the last for a step's new entries)."""
    shape = getattr(kept, "shape", ())
    if mask is None or len(shape) < 2 or int(shape[1]) >= mask.shape[1]:
        return mask
    return mask[:, mask.shape[1] - int(shape[1]):]


def _compared(step: int, kept: CapturedTensor, ref: DecodePass, alt: DecodePass, layer: int) -> str:
    """What a KV row compared: ``"new entries"`` (the step's last positions) or the whole cache,
    and why (``"prefill"``, ``"audit"``, ``"rewrite"``)."""
    spans = {p.span.get(layer, "audit") for p in (ref, alt)}
    if step and int(getattr(kept, "shape", (0, 0))[1]) <= KV_TAIL and "new" in spans:
        return "new entries"
    return "whole cache (" + "/".join(sorted(spans - {"new"})) + ")"


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
