"""Token-level metrics of two logits tensors (comparison.next_token) on known distributions, and the
judge's rule over them (judge_tokens: a correct run's KL and decisive top-1 flips times the noise
margin)."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch

from debug_framework.comparison import next_token
from debug_framework.comparison.next_token import next_token_metrics


def _logits(seed: int = 0, shape=(2, 4, 11)) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def test_identical_logits_agree_everywhere():
    ref = _logits()
    m = next_token_metrics(ref, torch.from_numpy(ref.astype(np.float32)).double())
    assert m.positions == 8 and m.top1_agreement == 1.0 and m.topk_overlap == 1.0 and not m.flips
    assert m.kl_divergence["max"] < 1e-12 and abs(m.delta_p["mean"]) < 1e-7 and m.logits_nmse < 1e-12
    # a float32-sized difference: KL = Var_p(d) / 2 to second order, not float64 rounding noise
    d = np.random.default_rng(9).normal(size=ref.shape) * 1e-7
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = 0.5 * (np.sum(p * d * d, -1) - np.sum(p * d, -1) ** 2)
    assert next_token_metrics(ref, ref - d).kl_divergence["mean"] == pytest.approx(expected.mean(), rel=1e-3)
    exact = next_token_metrics(ref, ref)
    assert exact.kl_divergence == {"mean": 0.0, "p99": 0.0, "max": 0.0} and exact.logits_nmse == 0.0


def test_kl_matches_its_definition_and_a_swapped_argmax_flips():
    ref = np.log(np.array([[[0.7, 0.2, 0.1]]]))
    alt = np.log(np.array([[[0.2, 0.7, 0.1]]]))
    m = next_token_metrics(ref, alt, k=2)
    expected = 0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.7)
    assert m.kl_divergence["mean"] == pytest.approx(expected) and m.kl_divergence["max"] == pytest.approx(expected)
    assert m.top1_agreement == 0.0 and m.topk_overlap == 1.0  # the same two tokens on top, swapped
    assert m.delta_p["mean"] == pytest.approx(0.2 - 0.7) and m.delta_p["max_abs"] == pytest.approx(0.5)
    (flip,) = m.flips
    assert (flip.index, flip.reference_token, flip.alternative_token) == ((0, 0), 0, 1)
    assert flip.reference_gap == pytest.approx(math.log(0.7 / 0.2))
    # one position of four flipped: agreement 3/4, the flip named at its index
    ref4 = _logits(1)
    alt4 = ref4.copy()
    alt4[1, 2, int(np.argmin(ref4[1, 2]))] += 50.0
    m4 = next_token_metrics(ref4, alt4)
    assert m4.top1_agreement == pytest.approx(7 / 8) and [f.index for f in m4.flips] == [(1, 2)]
    assert m4.kl_divergence["max"] > 10 and m4.kl_divergence["p99"] == m4.kl_divergence["max"]


def test_padded_positions_are_not_judged():
    """What an engine leaves at a padded position (zeros, garbage) changes nothing."""
    ref = _logits(2)
    alt = ref.copy()
    alt[1, :2] = 0.0  # row 1 is left-padded by two: its first positions are not outputs
    alt[0, 3] = 1e30
    mask = np.array([[1, 1, 1, 0], [0, 0, 1, 1]], dtype=bool)
    m = next_token_metrics(ref, alt, positions=mask)
    assert m.positions == 5 and m.top1_agreement == 1.0 and m.kl_divergence["max"] == 0.0
    assert next_token_metrics(ref, alt).top1_agreement < 1.0  # judged everywhere, they would flip


def test_non_finite_alternative_is_the_worst_disagreement():
    ref = _logits(3, (3, 7))  # [batch, vocab]
    alt = ref.copy()
    alt[2, 0] = np.nan
    m = next_token_metrics(ref, alt)
    assert math.isinf(m.kl_divergence["max"]) and math.isinf(m.logits_nmse)
    assert [f.index for f in m.flips] == [(2,)] and math.isinf(m.flips[0].reference_gap)
    with pytest.raises(ValueError, match="one shape"):
        next_token_metrics(ref, ref[:, :3])


def test_doctest():
    assert doctest.testmod(next_token).failed == 0


def _evidence(alt_flips_gap: float, cal_flips: int = 0, kl_alt: float = 1e-8, kl_cal: float = 1e-8):
    from debug_framework.comparison.next_token import TokenFlip, TokenMetrics
    from debug_framework.services.validation.evidence import TokenEvidence

    def metrics(kl: float, flips: list) -> TokenMetrics:
        return TokenMetrics(4, {"mean": kl, "p99": kl, "max": kl}, 1 - len(flips) / 4, 1.0, 5,
                            {"mean": 0.0, "rms": 0.0, "max_abs": 0.0}, 0.0, tuple(flips))

    alt = [] if alt_flips_gap is None else [TokenFlip((0, 3), 1, 2, alt_flips_gap)]
    cal = [TokenFlip((1, 3), 4, 5, 1.0)] * cal_flips
    return TokenEvidence(1, metrics(kl_alt, alt), metrics(kl_cal, cal), noise_max_abs=1e-3, reference_rms=1.0)


@pytest.fixture(scope="module")
def plan():
    from debug_framework.services.validation.plan import ValidationPlan

    return ValidationPlan.resolve({"dtype": "float32", "reference_dtype": "float64"}, 2)


def test_the_judge_holds_tokens_to_a_correct_runs(plan):
    from debug_framework.services.validation.judge import judge_tokens

    assert judge_tokens(_evidence(None), plan).passed
    near_tie = judge_tokens(_evidence(1e-3), plan)  # within 2 x noise_margin x the calibration's logit error
    assert near_tie.passed and near_tie.judged_by == "token_metrics"
    decisive = judge_tokens(_evidence(0.5), plan)
    assert not decisive.passed and "next token differs" in decisive.reason and "2 instead of 1" in decisive.reason
    assert judge_tokens(_evidence(0.5, cal_flips=1), plan).passed  # a correct run flips as many: noise
    kl = judge_tokens(_evidence(None, kl_alt=1e-6), plan)
    assert not kl.passed and kl.margin == pytest.approx(1e-6 / (16e-8 + kl.rule.floor)) and "KL" in kl.reason


def _decoded(judgement, top1: float):
    """A result that decoded one step whose token metrics ``judgement`` judged (issue 48, item 7)."""
    from debug_framework.services.validation.judge import Verdict
    from debug_framework.services.validation.results import ValidationResult, _judged_tokens

    row = {"step": 1, "positions": 4, "kl_divergence": {"mean": judgement.rule.alternative_error},
           "top1_agreement": top1, "topk_overlap": 1.0}
    judged = _judged_tokens(row, Verdict({}, None, None, None, tokens={1: judgement}))
    return judged, ValidationResult.from_dict({"session_id": "s", "results": [], "decode": {"steps": 1,
                                                                                            "token_metrics": [judged]}})


def test_the_token_columns_say_which_metric_failed_and_against_what(plan):
    """A pass failed by its mean KL with every top-1 token agreeing marks the KL, beside its bound, not
    top-1; one failed by flipped tokens marks top-1; the line under the grid names the metric and bound."""
    from debug_framework.reports._decode import decode_section, decode_text

    kl = judge_tokens_of(_evidence(None, kl_alt=1e-6), plan)
    row, result = _decoded(kl, 1.0)
    assert row["failed_by"] == ["kl_divergence"] and row["bound"] == pytest.approx(kl.bound)
    lines = decode_text(result, 80)
    step = next(x for x in lines if x.split() and x.split()[0] == "1")
    assert step.split()[-3:] == ["1.0e-06*", f"{kl.bound:.1e}", "1.00"]  # KL failed, against its bound
    assert f"tokens fail at step 1 by mean KL 1.0e-06 > bound {kl.bound:.1e}: " in "\n".join(lines)
    html = decode_section(result)
    assert '<td class="num fail">1.0e-06*</td>' in html and f"<td class=\"num\">{kl.bound:.1e}</td>" in html
    assert '<td class="num">1.0</td>' in html  # top-1 agreement 1.0, not marked

    flips = judge_tokens_of(_evidence(0.5), plan)
    row, result = _decoded(flips, 0.75)
    assert row["failed_by"] == ["top1"]
    step = next(x for x in decode_text(result, 80) if x.split() and x.split()[0] == "1")
    assert step.split()[-3:] == ["1.0e-08", f"{flips.bound:.1e}", "0.75*"]
    assert '<td class="num fail">0.75*</td>' in decode_section(result)


def judge_tokens_of(evidence, plan):
    from debug_framework.services.validation.judge import judge_tokens

    return judge_tokens(evidence, plan)
