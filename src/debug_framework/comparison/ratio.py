"""The ratio rule: judge an implementation against a high-precision oracle relative to a baseline.

    err(alternative, oracle) <= multiplier * err(reference, oracle) + floor

The errors are one metric (``rmse`` by default) of two comparisons against the same oracle (a
float64 run): the alternative's, and the reference's or baseline's (the float32 eager run), so an
implementation is allowed the error the baseline itself makes, times ``multiplier``, plus
``floor``. The defaults (2.0, 1e-5) are those of torch's own accuracy checks. Used by the
validation engine's oracle mode and by KernelDiff's ``reference_backend="float64"``.

    >>> rule = RatioRule(multiplier=2.0, floor=1e-5)
    >>> j = rule.judge(reference_error=1e-3, alternative_error=1.5e-3)
    >>> j.passed, round(j.ratio, 2)
    (True, 1.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .result import ComparisonResult

__all__ = ["RatioRule", "RatioVerdict", "OracleJudgement", "finite_metric", "error_metric", "finite_rms",
           "float64_array", "NOISE_MARGIN", "FLOOR_EPS"]

#: The calibrated rule's defaults: a correct implementation is allowed ``NOISE_MARGIN`` times the
#: error a trusted implementation makes at the same precision, plus ``FLOOR_EPS`` x eps(dtype) x the
#: reference's RMS (a floor relative to the tensor's scale, never a fixed absolute number).
NOISE_MARGIN = 4.0
FLOOR_EPS = 1.0


def float64_array(x: object) -> np.ndarray:
    """``x`` (a torch tensor of any dtype and device, or anything NumPy reads) as a float64 NumPy array."""
    if hasattr(x, "detach"):
        import torch

        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def finite_rms(x: object) -> float:
    """Root mean square of the finite values of ``x`` (a tensor or an array), in float64; 0.0 when
    there are none."""
    a = float64_array(x)
    a = np.abs(a[np.isfinite(a)])
    peak = float(a.max()) if a.size else 0.0
    if peak == 0.0:
        return 0.0
    return peak * float(np.sqrt(np.mean((a / peak) ** 2)))  # scaled: no overflow near the dtype's max


def finite_metric(result: ComparisonResult | None, name: str) -> float | None:
    """Metric ``name`` of ``result`` over its finite pairs: ``0.0`` for an empty comparison, ``None``
    when it cannot be measured (no result, a shape mismatch, or no finite pair in a non-empty tensor)."""
    if result is None or not result.shape_match:
        return None
    value: float | int | None = getattr(result, name)
    if value is None:
        return None if result.numel else 0.0
    return float(value)


def error_metric(result: ComparisonResult | None, name: str) -> float:
    """Metric ``name`` of ``result`` as an error to judge: NaN when it cannot be measured (see
    :func:`finite_metric`), infinity when non-finite values mismatch, else the value."""
    value = finite_metric(result, name)
    if value is None:
        return math.nan
    if result is not None and result.nonfinite_mismatch_count:
        return math.inf
    return value


@dataclass(slots=True)
class OracleJudgement:
    """The ratio rule at one place: ``alternative_error <= multiplier * reference_error + floor``."""

    metric: str
    reference_error: float
    alternative_error: float
    multiplier: float
    floor: float

    @property
    def bound(self) -> float:
        return self.multiplier * self.reference_error + self.floor

    @property
    def passed(self) -> bool:
        return bool(self.alternative_error <= self.bound)  # NaN compares False: fails

    @property
    def margin(self) -> float:
        """``alternative_error / bound``: at most 1 passes (0 when both are 0, NaN when unmeasured)."""
        if self.bound == 0:
            return 0.0 if self.alternative_error == 0 else math.inf
        return self.alternative_error / self.bound

    @property
    def ratio(self) -> float:
        """``alternative_error / reference_error`` (0 when both are 0, infinity when only the reference's is)."""
        if self.reference_error == 0:
            return 0.0 if self.alternative_error == 0 else math.inf
        return self.alternative_error / self.reference_error

    def to_dict(self) -> dict[str, str | float | bool]:
        return {"metric": self.metric, "reference_error": self.reference_error,
                "alternative_error": self.alternative_error, "multiplier": self.multiplier,
                "floor": self.floor, "bound": self.bound, "ratio": self.ratio, "margin": self.margin,
                "passed": self.passed}


@dataclass(frozen=True)
class RatioRule:
    """``err(alternative) <= multiplier * err(reference) + floor`` on metric ``metric``."""

    multiplier: float = 2.0
    floor: float = 1e-5
    metric: str = "rmse"

    @classmethod
    def calibrated(cls, reference: object, eps: float, *, margin: float = NOISE_MARGIN, floor_eps: float = FLOOR_EPS,
                   metric: str = "rmse") -> RatioRule:
        """The calibrated rule at one tensor: ``margin`` x the baseline's error plus a floor of
        ``floor_eps`` x ``eps`` (the machine epsilon of the precision judged) x RMS(``reference``).
        The validation engine's calibrated bounds and the plugin op sweep both use it."""
        return cls(float(margin), float(floor_eps) * float(eps) * finite_rms(reference), metric)

    def judge(self, reference_error: float, alternative_error: float) -> OracleJudgement:
        """Judge two errors already measured against the oracle (NaN fails)."""
        return OracleJudgement(self.metric, float(reference_error), float(alternative_error),
                               float(self.multiplier), float(self.floor))

    def judge_results(self, reference: ComparisonResult | None, alternative: ComparisonResult | None) -> OracleJudgement:
        """Judge two comparisons against the same oracle by :func:`error_metric` of ``metric``."""
        return self.judge(error_metric(reference, self.metric), error_metric(alternative, self.metric))

    def verdict(self, baseline: ComparisonResult, test: ComparisonResult, *, oracle: str = "the oracle",
                baseline_name: str = "the baseline") -> RatioVerdict:
        """The rule on two comparisons against the same oracle: ``baseline`` (the trusted
        implementation's, e.g. float32 eager or the reference backend) and ``test``.

        The metric is taken over the finite pairs; non-finite values are judged apart: ``test`` may
        not have more non-finite mismatches against the oracle than ``baseline`` has. A shape
        mismatch fails; so does having no finite pair to measure, unless every value matches the
        oracle exactly (NaN where NaN, the same infinities). This is the one ratio verdict of the project:
        the validation oracle stage, KernelDiff's float64 mode and the minifier's accuracy signature
        all call it."""
        test_err, base_err = self._errors(baseline, test)
        judgement = self.judge(base_err, math.nan if test_err is None else test_err)
        if not test.shape_match:
            return RatioVerdict(False, test.reason, judgement)
        if test.nonfinite_mismatch_count > baseline.nonfinite_mismatch_count:
            return RatioVerdict(False, f"{test.nonfinite_mismatch_count} non-finite mismatch(es) against {oracle} "
                                       f"({baseline_name} has {baseline.nonfinite_mismatch_count})", judgement)
        if test_err is None:
            return RatioVerdict(False, "no finite values to compare", judgement)
        if not judgement.passed:
            label = "RMSE" if self.metric == "rmse" else self.metric
            return RatioVerdict(False, f"{label} {test_err:.3e} vs {oracle} exceeds {self.multiplier:g} x "
                                       f"{baseline_name}'s {label} {base_err:.3e} + {self.floor:g}", judgement)
        return RatioVerdict(True, None, judgement)

    def passes(self, baseline: ComparisonResult, test: ComparisonResult) -> bool:
        """``verdict(baseline, test).passed`` (the same checks, in the same arithmetic) without the
        verdict's reason and records: what a decode step asks of each of its many checks."""
        test_err, base_err = self._errors(baseline, test)
        return test.shape_match and test.nonfinite_mismatch_count <= baseline.nonfinite_mismatch_count \
            and test_err is not None and self.judge(base_err, test_err).passed

    def _errors(self, baseline: ComparisonResult, test: ComparisonResult) -> tuple[float | None, float]:
        """The rule's two errors: ``test``'s (None: unmeasurable) and ``baseline``'s (0 where unmeasured)."""
        test_err = finite_metric(test, self.metric)
        base_err = finite_metric(baseline, self.metric) or 0.0
        if test_err is None and test.shape_match and test.nonfinite_mismatch_count == 0:
            test_err = 0.0  # nothing finite, every non-finite value where the oracle has it: an exact match
        return test_err, base_err


@dataclass(frozen=True)
class RatioVerdict:
    """What :meth:`RatioRule.verdict` decided: pass or fail, why, and the errors it weighed."""

    passed: bool
    reason: str | None
    judgement: OracleJudgement

    def to_dict(self) -> dict[str, str | float | bool | None]:
        """The judgement's fields, with this verdict's ``passed`` and ``reason``."""
        return {**self.judgement.to_dict(), "passed": self.passed, "reason": self.reason}
