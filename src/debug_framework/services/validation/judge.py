"""The one judge of a validation: ``judge(evidence, plan) -> Verdict``.

Pure: it reads only the :class:`~.evidence.Evidence` the stages measured and the session's
:class:`~.plan.ValidationPlan`, and decides everything that is a verdict:

* each checkpoint's pass or fail, by exactly one rule: ``"oracle"`` (the ratio rule against the
  float64 oracle), ``"calibration"`` (``err <= noise_margin x noise + floor_eps x eps x RMS(ref)``),
  ``"tolerance"`` (allclose, where ``precision_thresholds`` sets one or calibration is off) or
  ``"isolation"`` (its own error is within its bound, but the block that ends there introduces
  error on the reference's input);
* per layer, which blocks introduce error: the attention block judged on the reference's layer
  input, the MLP block on the reference's post-attention state, and the whole layer on the
  reference's layer input (error that neither block makes alone: the wiring between them);
* the first divergence, the introducing layers and the error source;
* where checkpoints fail, whether the whole run is **consistent with a correct run at a lower
  precision** (``consistent_with``: ``"float16"``, ``"bfloat16"``, or the precision the alternative's
  engine declares and emulates, llama.cpp's ``"q8_0"``, a torchao module's ``"int8_weight_only"``...):
  at every checkpoint measured,
  the alternative's error is within the calibrated bound of a correct run at that precision and not
  far below it (a run computed at that precision errs everywhere, the embedding included, so a bug
  in one place of an otherwise exact run is never named so).

Every rule is :meth:`debug_framework.comparison.RatioRule.verdict` or a tolerance's allclose; no
stage decides anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ...capture.keys import CheckpointKey
from ...comparison import ComparisonResult, OracleJudgement, RatioRule
from ...comparison.noise import NoiseEvidence, judge_with_noise
from ...comparison.next_token import TokenFlip, TokenMetrics
from ...jsonio import JsonObject, as_float
from .evidence import BlockEvidence, CheckpointEvidence, Evidence, KVEvidence, LayerEvidence, TokenEvidence
from .plan import DTYPE_EPS, ValidationPlan

__all__ = ["Judgement", "LayerVerdict", "Verdict", "judge", "error_source", "consistent_precision", "PRECISION_BAND",
           "node_output_verdict", "judge_tokens", "decisive_flips", "FLIPS_REASON",
           "first_divergent_token", "served_source", "checkpoint_passes", "kv_passes"]

#: A run consistent with a lower precision errs like a correct run there at every checkpoint: its
#: error is within that run's calibrated bound and at least 1 / PRECISION_BAND of that run's error.
PRECISION_BAND = 8.0
#: How the noise rule's runs of a validation were perturbed (:mod:`.noise_stage`).
PERTURBED_WEIGHTS = ("each weight and floating input moved by at most 1/8 ulp of the precision the trusted run "
                     "computes at before it rounds them (one ulp of their own dtype where that is as coarse)")
#: How a pass failed by its top-1 tokens begins its reason (:func:`judge_tokens`).
FLIPS_REASON = "the next token differs beyond noise"


@dataclass(frozen=True, slots=True)
class Judgement:
    """One rule applied at one place.

    Attributes:
        passed: the verdict.
        judged_by: the rule: ``"calibration"``, ``"tolerance"``, ``"oracle"``, ``"isolation"`` or
            ``"expert_choice"`` (a router chose other experts than the reference's).
        bound: the bound the error was held to (the rule's metric units; None for an elementwise
            tolerance).
        margin: error / bound (at most 1 passes); for a tolerance ``max |a - r| / (atol + rtol |r|)``.
        reason: why it failed (None when it passed).
        rule: the ratio rule's errors, multiplier and floor where one decided (None for a tolerance).
        consistent_with: on a failed checkpoint of a run consistent with a correct run at a lower
            precision, that precision (``"bfloat16"``, ``"float16"``); else None.
        noise: where the single run's bound was exceeded and the noise rule measured the trusted
            side on perturbed inputs (:func:`~debug_framework.comparison.judge_with_noise`): what it
            found and by how much the bound widened; else None.
    """

    passed: bool
    judged_by: str
    bound: float | None = None
    margin: float | None = None
    reason: str | None = None
    rule: OracleJudgement | None = None
    consistent_with: str | None = None
    noise: NoiseEvidence | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Judgement:
        """A stored judgement read back (:meth:`to_dict`'s fields and the noise rule's evidence; the
        rule's other details are read by ``results.judgement_from``)."""
        consistent = data.get("consistent_with")
        rule = data.get("rule")
        noise = rule.get("noise") if isinstance(rule, Mapping) else None
        return cls(bool(data.get("passed")), str(data.get("judged_by") or "tolerance"), as_float(data.get("bound")),
                   as_float(data.get("margin")), data.get("reason"),
                   consistent_with=consistent if isinstance(consistent, str) else None,
                   noise=NoiseEvidence.from_dict(noise) if isinstance(noise, Mapping) else None)

    def to_dict(self) -> JsonObject:
        """``passed``, ``judged_by``, ``bound``, ``margin``, ``reason`` and the rule's details."""
        out: JsonObject = {"passed": self.passed, "judged_by": self.judged_by, "bound": self.bound,
                               "margin": self.margin, "reason": self.reason}
        if self.rule is not None:
            j = self.rule
            out["rule"] = {"metric": j.metric, "error": j.alternative_error, "baseline_error": j.reference_error,
                           "multiplier": j.multiplier, "floor": j.floor,
                           **({} if self.noise is None else {"noise": self.noise.to_dict()})}
        return out


@dataclass(frozen=True)
class LayerVerdict:
    """What layer ``layer`` introduces, block by block (each judged on the reference's input).

    ``mlp`` is None when the MLP block could not be judged apart (the backend cannot run it alone
    and the attention block's error reached it); ``mlp_input`` says what the MLP judgement was fed.
    """

    layer: int
    attention: Judgement | None
    mlp: Judgement | None
    whole: Judgement
    mlp_input: str | None

    @property
    def blocks(self) -> list[str]:
        """The blocks that introduce error, in order; ``"layer"`` when neither block alone does but
        the whole layer replayed on the reference's input does."""
        out = [name for name, j in (("attention", self.attention), ("mlp", self.mlp)) if j is not None and not j.passed]
        if not out and not self.whole.passed and self.mlp_input == "reference":
            out.append("layer")
        return out

    @property
    def block(self) -> str | None:
        """The first block that introduces error (None: the layer only carries what came in)."""
        blocks = self.blocks
        return blocks[0] if blocks else None

    @property
    def introduces(self) -> bool:
        return self.block is not None

    def part_at(self, key: CheckpointKey) -> str | None:
        """Which judgement stands for the block ending at checkpoint ``key``: ``"attention"`` at
        post_attention; at post_mlp ``"mlp"``, or ``"whole"`` where only the whole layer fails."""
        if key.name == "post_attention":
            return None if self.attention is None else "attention"
        if key.name == "post_mlp":
            if self.block == "layer":
                return "whole"
            return None if self.mlp is None else "mlp"
        return None

    def at(self, key: CheckpointKey) -> Judgement | None:
        """The judgement of the block that ends at checkpoint ``key`` (None: not judged apart)."""
        part = self.part_at(key)
        return None if part is None else {"attention": self.attention, "mlp": self.mlp, "whole": self.whole}[part]

    def introduces_at(self, key: CheckpointKey) -> bool | None:
        """Whether the block ending at ``key`` introduces error (None: not judged apart)."""
        j = self.at(key)
        return None if j is None else not j.passed


@dataclass(frozen=True)
class Verdict:
    """Everything the judge decided."""

    checkpoints: dict[CheckpointKey, Judgement]
    layers: dict[int, LayerVerdict] | None
    first_divergence: CheckpointKey | None
    error_source: JsonObject | None
    #: the lower precision a correct run at which errs as this run does (None: none, or it passed)
    consistent_with: str | None = None
    #: each decode step's checkpoints (step >= 1; the prefill's are :attr:`checkpoints`)
    steps: dict[tuple[int, CheckpointKey], Judgement] = field(default_factory=dict)
    #: the decode step of the first divergence (None: the prefill, or no divergence)
    first_step: int | None = None
    #: the KV cache after each pass, by ``(step, layer, part)``: named as a source, not a verdict
    kv: dict[tuple[int, int, str], Judgement] = field(default_factory=dict)
    #: the next-token distributions at each pass's logits, by step (0: the prefill); a failure is
    #: also the ``post_processing`` checkpoint's judgement at that step
    tokens: dict[int, Judgement] = field(default_factory=dict)
    #: the first token the alternative chooses otherwise beyond noise: ``{step, index,
    #: reference_token, alternative_token, reference_gap}`` (None: none)
    first_divergent_token: JsonObject | None = None
    #: each layer failing at decode step :attr:`first_step`, replayed there on the reference's input:
    #: beyond its bound (not passed) it introduces error at that step, within it the error is carried in
    decode_layers: dict[int, Judgement] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checkpoints) and all(j.passed for j in self.checkpoints.values()) \
            and all(j.passed for j in self.steps.values())

    def of(self, key: CheckpointKey, step: int | None) -> Judgement:
        """The judgement of checkpoint ``key`` at decode ``step`` (None or 0: the prefill)."""
        return self.steps[(step, key)] if step else self.checkpoints[key]

    @property
    def introducing_layers(self) -> list[int]:
        return [i for i, lv in sorted((self.layers or {}).items()) if lv.introduces]


def _ratio(rule: RatioRule, baseline: ComparisonResult, test: ComparisonResult, judged_by: str, *,
           oracle: str, baseline_name: str, prefix: str,
           perturbed: tuple[ComparisonResult, ...] | None = None) -> Judgement:
    """The ratio rule's verdict; where it fails and the noise rule's runs were measured
    (``perturbed``: the trusted side on inputs perturbed within rounding, against the same oracle),
    judged again on the largest noise they show (:func:`~debug_framework.comparison.judge_with_noise`)."""
    if not perturbed:
        v, noise = rule.verdict(baseline, test, oracle=oracle, baseline_name=baseline_name), None
    else:
        runs = len(perturbed)
        v, noise = judge_with_noise(rule, baseline, test, lambda k: perturbed[k - 1], runs=runs, oracle=oracle,
                                    baseline_name=baseline_name, perturbation=PERTURBED_WEIGHTS)
    return Judgement(v.passed, judged_by, v.judgement.bound, v.judgement.margin,
                     None if v.passed else f"{prefix}{v.reason}", v.judgement, noise=noise)


def _calibrated_rule(plan: ValidationPlan, reference_rms: float) -> RatioRule:
    """The calibrated rule at a tensor of RMS ``reference_rms``: ``noise_margin`` x the noise plus
    ``floor_eps`` x eps x RMS (no floor where the RMS is unmeasured)."""
    cfg = plan.config
    floor = cfg.floor_eps * plan.eps * (0.0 if math.isnan(reference_rms) else reference_rms)
    return RatioRule(cfg.noise_margin, floor, cfg.calibration_metric)


def _calibrated(plan: ValidationPlan, noise: ComparisonResult, error: ComparisonResult, reference_rms: float,
                what: str = "", perturbed: tuple[ComparisonResult, ...] | None = None) -> Judgement:
    rule = _calibrated_rule(plan, reference_rms)
    return _ratio(rule, noise, error, "calibration", oracle="the reference",
                  baseline_name=f"a correct {plan.alternative_dtype} run{what}", prefix="calibrated bound: ",
                  perturbed=perturbed)


def _tolerance(comparison: ComparisonResult, margin: float | None = None) -> Judgement:
    return Judgement(comparison.passed, "tolerance", None, margin, None if comparison.passed else comparison.reason)


def judge_checkpoint(ev: CheckpointEvidence, evidence: Evidence, plan: ValidationPlan) -> Judgement:
    """The checkpoint's own rule, before isolation: the oracle's, the calibrated bound or its tolerance."""
    choice = ev.expert_choice
    # as the calibrated rule: a correct run at this precision that flips near-tied choices at n
    # tokens allows noise_margin x n (none where it flips none)
    allowed = plan.config.noise_margin * (choice.calibration_differing or 0) if choice is not None else 0.0
    if choice is not None and choice.differing > allowed:
        noise = "" if choice.calibration_differing is None else (
            f"; a correct run at this precision differs at {choice.calibration_differing}")
        return Judgement(False, "expert_choice", reason=(
            f"the router chose other experts (top {choice.top_k}) for {choice.differing} of {choice.tokens} tokens, "
            f"first at token {choice.first}{noise}"))
    setup = evidence.oracle
    if setup is not None:
        if ev.oracle is None:
            return Judgement(False, "oracle", reason=f"no tensor for {ev.key} from one of the three runs")
        floor = setup.fixed_floor if setup.fixed_floor is not None else (
            plan.config.floor_eps * plan.eps * ev.oracle.oracle_rms)
        rule = RatioRule(setup.multiplier, float(floor), setup.metric)
        return _ratio(rule, ev.oracle.baseline, ev.oracle.alternative, "oracle", oracle="the float64 oracle",
                      baseline_name=setup.baseline, prefix="oracle ratio rule: ", perturbed=ev.perturbed)
    if ev.noise is not None and ev.present and plan.calibrated(ev.key):
        return _calibrated(plan, ev.noise, ev.comparison, ev.reference_rms, perturbed=ev.perturbed)
    return _tolerance(ev.comparison, ev.tolerance_margin)


def checkpoint_passes(ev: CheckpointEvidence, evidence: Evidence, plan: ValidationPlan) -> bool:
    """``judge_checkpoint(ev, evidence, plan).passed``; a checkpoint judged by its calibrated bound
    alone (no expert choice, no oracle, no noise rule's runs) decided by
    :meth:`~debug_framework.comparison.RatioRule.passes`, without the judgement's records: a decode
    step asks it of every checkpoint (:mod:`.decode_walk`), the judge decides it again in full."""
    if ev.expert_choice is None and evidence.oracle is None and not ev.perturbed and ev.noise is not None \
            and ev.present and plan.calibrated(ev.key):
        return _calibrated_rule(plan, ev.reference_rms).passes(ev.noise, ev.comparison)
    return judge_checkpoint(ev, evidence, plan).passed


def judge_block(ev: BlockEvidence, plan: ValidationPlan) -> Judgement:
    """A block replay: by its calibrated bound (the calibration's replay of the same block on the
    same input) where its checkpoint is calibrated, else by the checkpoint's tolerance."""
    replayed = not (ev.error.numel == 0 and not ev.error.passed)  # no tensor came back: judged as failed
    if ev.noise is not None and replayed and plan.calibrated(ev.key):
        what = " replaying the layer" if ev.block == "layer" else f" replaying the {ev.block} block"
        return _calibrated(plan, ev.noise, ev.error, ev.reference_rms, what, perturbed=ev.perturbed)
    return _tolerance(ev.error)


def judge_layer(ev: LayerEvidence, plan: ValidationPlan) -> LayerVerdict:
    """Each block on the reference's input; without an MLP-alone replay, the MLP is judged on the
    whole-layer replay only where the attention block passed (else not apart)."""
    attention = None if ev.attention is None else judge_block(ev.attention, plan)
    whole = judge_block(ev.whole, plan)
    if ev.mlp is not None:
        mlp, mlp_input = judge_block(ev.mlp, plan), ev.mlp.input
    elif attention is not None and not attention.passed:
        mlp, mlp_input = None, None
    else:
        mlp, mlp_input = whole, "alternative" if attention is not None else "reference"
    return LayerVerdict(ev.layer, attention, mlp, whole, mlp_input)


def _with_isolation(own: Judgement, layer: LayerVerdict | None, key: CheckpointKey) -> Judgement:
    """A checkpoint within its own bound still fails where the block ending there introduces error
    by a calibrated replay (or, for a checkpoint judged by a tolerance, by its tolerance): a fixed
    tolerance never overrides a calibrated or oracle verdict."""
    block = None if layer is None else layer.at(key)
    if not own.passed or block is None or block.passed:
        return own
    if block.judged_by != "calibration" and own.judged_by != "tolerance":
        return own
    return Judgement(False, "isolation", block.bound, block.margin,
                     f"layer {key.layer} introduces error on its own: {block.reason or 'its replay fails its tolerance'}",
                     block.rule)


def judge(evidence: Evidence, plan: ValidationPlan) -> Verdict:
    """Decide every verdict of a validation from its evidence (see the module's docstring)."""
    layers = None if evidence.layers is None else {ev.layer: judge_layer(ev, plan) for ev in evidence.layers}
    checkpoints: dict[CheckpointKey, Judgement] = {}
    steps: dict[tuple[int, CheckpointKey], Judgement] = {}
    tokens = {ev.step: judge_tokens(ev, plan) for ev in evidence.token_metrics
              if ev.calibration is not None and ev.alternative.positions}  # none judged: nothing to predict from
    for ev in evidence.checkpoints:
        own = judge_checkpoint(ev, evidence, plan)
        by_tokens = tokens.get(ev.step or 0) if ev.key.name == "post_processing" else None
        if by_tokens is not None and not by_tokens.passed:  # the tokens chosen decide first, as experts do
            own = by_tokens
        if ev.step:  # a decode step: its own rule (isolation replays the prefill's layers)
            steps[(ev.step, ev.key)] = own
            continue
        lv = None if layers is None or ev.key.layer is None else layers.get(ev.key.layer)
        checkpoints[ev.key] = _with_isolation(own, lv, ev.key)
    first = next((k for k, j in checkpoints.items() if not j.passed), None)
    first_step = None
    if first is None:  # the prefill passes: the first decode step that does not
        first_step, first = next(((s, k) for (s, k), j in steps.items() if not j.passed), (None, None))
    consistent = None if first is None or first_step else consistent_precision(evidence, plan)
    if consistent is not None:
        checkpoints = {k: j if j.passed else replace(j, consistent_with=consistent) for k, j in checkpoints.items()}
    kv = {(ev.step, ev.layer, ev.part): judge_kv(ev, plan) for ev in evidence.kv_cache}
    replayed = evidence.decode_replay
    at_step = {i: judge_block(b, plan) for i, b in sorted(replayed[1].items())} \
        if replayed is not None and replayed[0] == first_step else {}
    replay = None if first is None or first.layer is None else at_step.get(first.layer)
    source = decode_source(first, first_step, kv, replay, evidence.decode_replay_note) if first_step else \
        error_source(first, layers, evidence.isolation_note)
    if evidence.served is not None and first is not None:
        source = served_source(evidence.served, first_step)
    return Verdict(checkpoints, layers, first, source, consistent, steps, first_step, kv, tokens,
                   first_divergent_token(evidence, plan), at_step)


def _token_scale(ev: TokenEvidence, plan: ValidationPlan) -> float:
    """A correct run's allowed logit error at one pass: ``noise_margin`` x the calibration's largest
    logit error + ``floor_eps`` x eps x RMS(reference logits)."""
    cfg = plan.config
    noise = 0.0 if math.isnan(ev.noise_max_abs) else ev.noise_max_abs
    rms = 0.0 if math.isnan(ev.reference_rms) else ev.reference_rms
    return cfg.noise_margin * noise + cfg.floor_eps * plan.eps * rms


def decisive_flips(metrics: TokenMetrics, ev: TokenEvidence, plan: ValidationPlan) -> list[TokenFlip]:
    """The flips of ``metrics`` (a :class:`~debug_framework.comparison.next_token.TokenMetrics`)
    that no error within a correct run's bound explains: the reference prefers its token by more
    than twice the allowed logit error (:func:`_token_scale`), so both logits moving by it cannot
    swap them. A near tie flipped is noise."""
    gap = 2.0 * _token_scale(ev, plan)
    return [f for f in metrics.flips if not f.reference_gap <= gap]  # NaN/inf gaps count


def judge_tokens(ev: TokenEvidence, plan: ValidationPlan) -> Judgement:
    """One pass's next-token distributions, judged as the router's experts are: the calibration
    (a correct run at the alternative's precision) gives the expected KL divergence and top-1
    flips. Fails where the mean KL exceeds ``noise_margin``² x the calibration's + a floor (the KL
    of a logit error at the calibrated floor, ``(floor_eps x eps x RMS)^2 / 2``; squared because KL
    grows with the square of the logits' error, ``Var_p(delta) / 2`` for a small error ``delta``, so
    this is the checkpoints' ``noise_margin`` x in error units), or where more tokens flip
    decisively (:func:`decisive_flips`) than ``noise_margin`` x those the calibration flips."""
    cfg = plan.config
    cal = ev.calibration
    assert cal is not None  # judged only where calibrated
    rms = 0.0 if math.isnan(ev.reference_rms) else ev.reference_rms
    floor = 0.5 * (cfg.floor_eps * plan.eps * rms) ** 2
    rule = RatioRule(cfg.noise_margin ** 2, floor, "kl_divergence")
    kl = rule.judge(cal.kl_divergence["mean"], ev.alternative.kl_divergence["mean"])
    flips = decisive_flips(ev.alternative, ev, plan)
    allowed = cfg.noise_margin * len(decisive_flips(cal, ev, plan))
    where = "the prefill" if ev.step == 0 else f"decode step {ev.step}"
    if len(flips) > allowed:
        f = flips[0]
        return Judgement(False, "token_metrics", kl.bound, kl.margin, (
            f"{FLIPS_REASON} at {len(flips)} of {ev.alternative.positions} position(s) of {where} "
            f"(a correct {plan.alternative_dtype} run: {len(decisive_flips(cal, ev, plan))}), first at "
            f"{list(f.index)}: {f.alternative_token} instead of {f.reference_token}"), kl)
    if not kl.passed:
        return Judgement(False, "token_metrics", kl.bound, kl.margin, (
            f"mean KL divergence of the next-token distributions {kl.alternative_error:.3e} at {where} exceeds "
            f"{kl.multiplier:g} x a correct {plan.alternative_dtype} run's {kl.reference_error:.3e} + {kl.floor:.3g}"), kl)
    return Judgement(True, "token_metrics", kl.bound, kl.margin, None, kl)


def first_divergent_token(evidence: Evidence, plan: ValidationPlan) -> JsonObject | None:
    """The first position (pass by pass, then row by row) whose top-1 token the alternative
    changes decisively (:func:`decisive_flips`), with its step."""
    for ev in sorted(evidence.token_metrics, key=lambda e: e.step):
        flips = decisive_flips(ev.alternative, ev, plan)
        if flips:
            return {"step": ev.step, **flips[0].to_dict()}
    return None


def judge_kv(ev: KVEvidence, plan: ValidationPlan) -> Judgement:
    """The cached keys or values of one layer after one pass, by the calibrated rule (the
    calibration's own cache the noise) where the calibration decoded, else the default tolerance."""
    if ev.noise is not None and ev.comparison.shape_match:
        return _calibrated(plan, ev.noise, ev.comparison, ev.reference_rms, " (its KV cache)")
    return _tolerance(ev.comparison)


def kv_passes(ev: KVEvidence, plan: ValidationPlan) -> bool:
    """``judge_kv(ev, plan).passed``, the calibrated bound decided without its records (every K and
    V of every decode step asks it)."""
    if ev.noise is not None and ev.comparison.shape_match:
        return _calibrated_rule(plan, ev.reference_rms).passes(ev.noise, ev.comparison)
    return ev.comparison.passed


def decode_source(first: CheckpointKey, step: int, kv: dict[tuple[int, int, str], Judgement] | None = None,
                  replay: Judgement | None = None, note: str | None = None) -> JsonObject:
    """Where the error of a run whose prefill passes comes from: the KV cache, where one written by
    an earlier pass (whose checkpoints passed) already differs beyond its bound; else decode
    ``step`` (the first whose checkpoint ``first`` fails), in that checkpoint's layer and block."""
    bad = sorted((s, layer, part) for (s, layer, part), j in (kv or {}).items() if s < step and not j.passed)
    if bad:
        s, layer, part = bad[0]
        when = "the prefill" if s == 0 else f"decode step {s}"
        return {"kind": "kv_cache", "step": s, "layer": layer, "block": "attention", "confirmed": True,
                "detail": f"the KV cache of layer {layer} ({'keys' if part == 'k' else 'values'}) after {when} "
                          f"differs beyond a correct run's while that pass's checkpoints matched; decode step "
                          f"{step} reads it and fails first at {first}"}
    where = f"layer {first.layer} ({_block_of(first)})" if first.layer is not None else str(first)
    shows = (f"the prefill passes; the error first shows at decode step {step}, in {where}: the decode path (the "
             "cache, the positions of cached tokens) differs from the prefill's")
    if replay is not None:
        how = ("replayed at that step on the reference's input, over its own cache, it exceeds its bound: the error "
               "is introduced there" if not replay.passed else "its replay at that step on the reference's input is "
               "within its bound: the error comes in with its input or its cache")
        return {"kind": "decode", "step": step, "layer": first.layer, "block": _block_of(first),
                "confirmed": not replay.passed, "detail": f"{shows}; {how}"}
    return {"kind": "decode", "step": step, "layer": first.layer, "block": _block_of(first), "confirmed": False,
            "detail": f"{shows} (not confirmed by a replay at that step: {note or 'isolation off'})"}


def served_source(endpoint: str, step: int | None) -> JsonObject:
    """Where the error of a served model comes from: the model behind ``endpoint`` (its conversion,
    kernels, KV cache or settings), first seen at the prefill or decode ``step``; it gives out no
    hidden state to place it deeper."""
    when = "its prompt's positions" if not step else f"decode step {step}"
    return {"kind": "served", "layer": None, "block": None, "step": step or None, "confirmed": False,
            "detail": f"the model served at {endpoint} first differs beyond a correct run's bound at {when}; it gives "
                      "out only token log-probabilities, so the error is placed no deeper than the served model "
                      "(its conversion, kernels, KV cache or settings): validate the same weights with a local engine "
                      "to find the layer"}


def consistent_precision(evidence: Evidence, plan: ValidationPlan) -> str | None:
    """The most precise lower precision (of those the precision stage measured, in its order) such
    that at every checkpoint where a correct run at it was measured, the alternative's error is
    within that run's calibrated bound (``noise_margin x its error + floor_eps x eps x RMS(ref)``)
    and that run's error is within ``PRECISION_BAND`` x the alternative's (plus the floor at the
    alternative's own precision). None when no precision fits every checkpoint."""
    cfg = plan.config
    metric = cfg.calibration_metric
    note = evidence.precision_note or {}
    emulated = dict(note.get("emulated") or {})  # an engine's emulated precision -> the dtype it computes in
    eps_of = {**{name: DTYPE_EPS[d] for name, d in emulated.items() if d in DTYPE_EPS}, **DTYPE_EPS}
    measured = [d for d in note.get("measured", []) if d in eps_of]
    for dtype in measured:  # a float dtype, or an emulated precision (at the eps of the dtype it computes in)
        seen = 0
        for ev in evidence.checkpoints:
            lower = (ev.lower_precision or {}).get(dtype)
            if lower is None or not ev.present:
                continue
            seen += 1
            rms = 0.0 if math.isnan(ev.reference_rms) else ev.reference_rms
            upper = RatioRule(cfg.noise_margin, cfg.floor_eps * eps_of[dtype] * rms, metric)
            below = RatioRule(PRECISION_BAND, cfg.floor_eps * plan.eps * rms, metric)
            if not (upper.verdict(lower, ev.comparison).passed and below.verdict(ev.comparison, lower).passed):
                break
        else:
            if seen:
                return dtype
    return None


def _block_of(key: CheckpointKey) -> str | None:
    return {"post_attention": "attention", "router_logits": "mlp", "post_mlp": "mlp"}.get(key.name)


def error_source(first: CheckpointKey | None, layers: dict[int, LayerVerdict] | None,
                 isolation_note: str | None = None) -> JsonObject | None:
    """Where the error of a failed validation comes from: ``kind`` is ``"embedding"`` (the embedding
    output already diverges), ``"layer"`` (``layer`` and ``block``: the first layer introducing error
    on its own, or, without isolation, the first layer where it shows: ``confirmed`` False),
    ``"head"`` (every per-layer checkpoint within its bound, the final norm / head output not) or
    ``"accumulation"`` (no layer introduces more than a correct run's replay error, yet the error
    carried through the layers grows beyond the bound at ``layer``). None when nothing failed."""
    if first is None:
        return None
    if first.name == "post_embedding":
        return {"kind": "embedding", "layer": None, "block": None, "confirmed": True,
                "detail": "the embedding output already diverges (post_embedding)"}
    intro = [lv for _, lv in sorted((layers or {}).items()) if lv.introduces]
    if intro and (first.layer is None or intro[0].layer <= first.layer):
        lv = intro[0]
        what = "its replay on the reference's input" if lv.block != "layer" else (
            "the whole layer replayed on the reference's input (neither block alone)")
        return {"kind": "layer", "layer": lv.layer, "block": lv.block, "confirmed": True,
                "detail": f"layer {lv.layer} ({lv.block}) introduces error on its own: {what} exceeds its bound"}
    if first.layer is None:
        return {"kind": "head", "layer": None, "block": None, "confirmed": layers is not None,
                "detail": "the final norm / head: every enabled per-layer checkpoint is within its bound, "
                          f"{first} is not"}
    if layers is None:
        return {"kind": "layer", "layer": first.layer, "block": _block_of(first), "confirmed": False,
                "detail": f"the error first shows in layer {first.layer} ({first}); isolation did not run "
                          f"({isolation_note or 'off'}), so this is where it shows, not confirmed as its source"}
    return {"kind": "accumulation", "layer": first.layer, "block": _block_of(first), "confirmed": True,
            "detail": f"no layer introduces more error than its bound on its own, yet the error carried through "
                      f"the layers exceeds the bound at {first} (see each layer's growth)"}


def node_output_verdict(error: float, noise: float, reference: object, dtype: str, margin: float,
                        floor_eps: float) -> tuple[float, bool]:
    """``(bound, passed)`` of one node output of the mark-all comparison (``mark_all.py``) by the
    calibrated rule at ``dtype``: ``error <= margin x noise + floor_eps x eps(dtype) x RMS(reference)``
    (``reference``: its finite, in-range values). An unmeasurable (infinite) error fails."""
    rule = RatioRule.calibrated(reference, DTYPE_EPS.get(dtype, DTYPE_EPS["float32"]), margin=margin,
                                floor_eps=floor_eps)
    judged = rule.judge(noise if math.isfinite(noise) else 0.0, error)
    return judged.bound, bool(judged.passed) and math.isfinite(error)
