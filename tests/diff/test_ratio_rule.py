"""The ratio rule (debug_framework.comparison.RatioRule), shared by validation's oracle mode and KernelDiff."""

from __future__ import annotations

import math

import pytest
import torch

from debug_framework.comparison import OracleJudgement, RatioRule, compare, error_metric, finite_metric
from debug_module.diff import KernelDiffHarness


def test_pass_and_fail_at_the_bound():
    rule = RatioRule(multiplier=2.0, floor=0.5)
    at = rule.judge(reference_error=1.0, alternative_error=2.5)
    assert at.bound == 2.5 and at.passed  # <= bound passes
    above = rule.judge(1.0, math.nextafter(2.5, math.inf))
    assert not above.passed and above.ratio == pytest.approx(2.5)


def test_nan_fails_and_zero_reference_error_ratio():
    rule = RatioRule()
    assert not rule.judge(1e-3, math.nan).passed
    assert not rule.judge(math.nan, 0.0).passed  # a NaN bound passes nothing
    assert rule.judge(0.0, 0.0).ratio == 0.0 and rule.judge(0.0, 0.0).passed
    only_alt = rule.judge(0.0, 1e-6)
    assert only_alt.ratio == math.inf and only_alt.passed  # under the floor: passes despite the infinite ratio
    assert not rule.judge(0.0, 1e-4).passed


def test_to_dict_format_is_the_stored_one():
    d = RatioRule(3.0, 1e-5, "max_abs_error").judge(1e-3, 2e-3).to_dict()
    assert list(d) == ["metric", "reference_error", "alternative_error", "multiplier", "floor", "bound", "ratio",
                       "margin", "passed"]
    assert d["metric"] == "max_abs_error" and d["bound"] == pytest.approx(3e-3 + 1e-5) and d["passed"] is True
    assert d["margin"] == pytest.approx(2e-3 / (3e-3 + 1e-5))  # error / bound: at most 1 passes
    assert RatioRule(2.0, 0.0).judge(0.0, 1e-9).margin == math.inf and RatioRule(2.0, 0.0).judge(0.0, 0.0).margin == 0
    assert OracleJudgement("rmse", 1.0, 1.0, 2.0, 0.0).to_dict()["ratio"] == 1.0


def test_metric_extraction_from_comparisons():
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    good = compare(ref, ref + 1e-3, check_dtype=False)
    assert error_metric(good, "rmse") == pytest.approx(1e-3)
    assert error_metric(None, "rmse") != error_metric(None, "rmse")  # NaN
    shape = compare(ref, torch.zeros(2, dtype=torch.float64))
    assert finite_metric(shape, "rmse") is None and math.isnan(error_metric(shape, "rmse"))
    nonfinite = compare(ref, torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64))
    assert finite_metric(nonfinite, "rmse") == 0.0 and error_metric(nonfinite, "rmse") == math.inf
    empty = compare(torch.zeros(0), torch.zeros(0))
    assert finite_metric(empty, "rmse") == 0.0 == error_metric(empty, "rmse")
    all_nan = compare(torch.full((2,), float("nan")), torch.full((2,), float("nan")), equal_nan=True)
    assert finite_metric(all_nan, "rmse") is None
    j = RatioRule().judge_results(good, good)
    assert j.passed and j.reference_error == j.alternative_error


def test_kerneldiff_float64_mode_judges_with_the_shared_rule(tiny):
    model, inputs = tiny
    harness = KernelDiffHarness(model, inputs, reference_backend="float64", test_backend="eager", runs=1,
                                float64_multiplier=3.0, float64_floor=1e-6, minify_on_failure=False)
    assert harness.ratio_rule == RatioRule(3.0, 1e-6, "rmse")
    report = harness.compare()
    assert report.passed and report.mode == "float64-ratio"
    ratio = report.outputs[0].ratio
    assert set(ratio) == {"test_error", "eager_error", "bound", "multiplier", "floor", "metric", "passed", "noise"}
    assert ratio["bound"] == pytest.approx(3.0 * ratio["eager_error"] + 1e-6) and ratio["test_error"] == ratio["eager_error"]
    assert report.tolerance == {"rule": "ratio", "metric": "rmse", "multiplier": 3.0, "floor": 1e-6}


def test_kerneldiff_rejects_unknown_tolerance_keywords(tiny):
    model, inputs = tiny
    with pytest.raises(TypeError, match="rtoll"):
        KernelDiffHarness(model, inputs, rtoll=1e-3)


def test_an_exact_match_with_nothing_finite_passes_and_a_mismatch_does_not():
    """A full reduction over NaN or Inf gives nothing finite: matching the oracle exactly passes."""
    rule = RatioRule.calibrated(torch.tensor([1.0]), torch.finfo(torch.float32).eps)
    oracle = torch.tensor([math.nan, math.inf], dtype=torch.float64)
    same = compare(oracle, oracle.float(), check_dtype=False, equal_nan=True)
    assert rule.verdict(same, same).passed
    wrong = compare(oracle, torch.tensor([math.nan, -math.inf]), check_dtype=False, equal_nan=True)
    verdict = rule.verdict(same, wrong)
    assert not verdict.passed and "non-finite mismatch" in verdict.reason


def test_the_calibrated_floor_follows_the_scale_of_the_reference():
    eps = torch.finfo(torch.float32).eps
    small, large = RatioRule.calibrated(torch.full((8,), 1e-3), eps), RatioRule.calibrated(torch.full((8,), 1e3), eps)
    assert small.multiplier == large.multiplier == 4.0
    assert small.floor == pytest.approx(eps * 1e-3) and large.floor == pytest.approx(eps * 1e3)
    huge = torch.full((4,), torch.finfo(torch.float64).max / 2, dtype=torch.float64)
    assert math.isfinite(RatioRule.calibrated(huge, eps).floor)  # no overflow near the dtype's max


def test_passes_is_the_verdicts_pass_or_fail():
    """RatioRule.passes (a decode step's many checks) decides as verdict does: within and beyond the
    bound, non-finite mismatches on either side, a shape mismatch, nothing finite to measure."""
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)

    def off(delta: float, first: float | None = None) -> object:
        alt = ref + delta
        if first is not None:
            alt[0] = first
        return compare(ref, alt, check_dtype=False)

    results = [off(0.0), off(1e-6), off(1e-3), off(0.5), off(0.0, math.nan), off(0.0, math.inf),
               compare(ref, ref[:3], check_dtype=False),
               compare(torch.tensor([math.nan]), torch.tensor([math.nan]), equal_nan=True)]
    seen = set()
    for rule in (RatioRule(2.0, 0.0), RatioRule(4.0, 1e-9), RatioRule(1.0, 1e-3, "max_abs_error")):
        for baseline in results:
            for test in results:
                want = rule.verdict(baseline, test).passed
                assert rule.passes(baseline, test) is want, (rule, baseline, test)
                seen.add(want)
    assert seen == {True, False}
