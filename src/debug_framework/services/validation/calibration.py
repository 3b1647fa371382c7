"""Calibrated judgement: each checkpoint's bound comes from measured noise.

A trusted implementation at the alternative's precision (by default ``torch_reference``: the
reference models run through torch in that dtype) runs on the same inputs. Its error against the
reference at a checkpoint is the *noise* a correct implementation at that precision makes there;
the alternative passes when

    err(alternative, reference) <= noise_margin * err(calibration, reference) + floor,
    floor = floor_eps * eps(dtype) * RMS(reference tensor)

by the project's one ratio verdict (:meth:`debug_framework.comparison.RatioRule.verdict`, metric
``calibration_metric``). Layer replays (isolation) are calibrated the same way: the trusted
implementation replays layer *i* on the reference's input too. Explicit tolerances
(``precision_thresholds``) win where given; ``calibrate: false`` turns it off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backends.base import Backend
from ...capture.keys import Capture, CheckpointKey
from ...comparison import (
    ComparisonResult,
    RatioRule,
    RatioVerdict,
    Tolerance,
    compare,
    finite_rms,
    float64_array,
)
from ...errors import ValidationError
from .plan import ValidationPlan

__all__ = ["scale_floor", "judge_by_noise", "tolerance_margin", "calibration_backend",
           "replay_noise", "noise_at"]


def scale_floor(plan: ValidationPlan, reference: Any) -> float:
    """The scale-relative floor of a bound: ``floor_eps * eps(governing dtype) * RMS(reference)``."""
    return float(plan.config["floor_eps"]) * plan.eps * finite_rms(reference)


def judge_by_noise(plan: ValidationPlan, reference: Any, noise: ComparisonResult, error: ComparisonResult,
                   *, what: str = "") -> RatioVerdict:
    """The calibrated verdict of ``error`` (alternative vs reference) given ``noise`` (the
    calibration run vs the same reference) at one checkpoint or replay."""
    rule = RatioRule.calibrated(reference, plan.eps, margin=float(plan.config["noise_margin"]),
                                floor_eps=float(plan.config["floor_eps"]), metric=str(plan.config["calibration_metric"]))
    verdict = rule.verdict(noise, error, oracle="the reference",
                           baseline_name=f"a correct {plan.alternative_dtype} run{what}")
    if verdict.reason and not verdict.passed:
        verdict = RatioVerdict(False, f"calibrated bound: {verdict.reason}", verdict.judgement)
    return verdict


def tolerance_margin(reference: Any, alternative: Any, tol: Tolerance) -> float | None:
    """``max |a - r| / (atol + rtol |r|)`` over finite pairs: the margin of an allclose tolerance
    (at most 1 passes); None when shapes differ or there is nothing finite to measure."""
    r, a = float64_array(reference), float64_array(alternative)
    if r.shape != a.shape:
        return None
    ok = np.isfinite(r) & np.isfinite(a)
    if not ok.any():
        return None
    allowed = tol.atol + tol.rtol * np.abs(r[ok])
    err = np.abs(a[ok] - r[ok])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(allowed > 0, err / np.where(allowed > 0, allowed, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(ratios.max())


def calibration_backend(plan: ValidationPlan, alternative_backend: str) -> Backend:
    """The trusted implementation of a session (``calibration_backend``), checked: it may not be
    the alternative itself and must run the alternative's dtype (DF005 saying what to pass)."""
    from ...backends import get_backend
    from ...backends.torch_reference import TorchReferenceBackend

    name = str(plan.config["calibration_backend"])
    hint = ("leave calibration_backend 'auto' (torch_reference: the reference models through torch), "
            "or set calibrate to false (then the dtype's fixed tolerances apply)")
    if name == alternative_backend:
        raise ValidationError(f"calibration_backend {name!r} is the alternative itself: a backend cannot "
                              "calibrate its own judgement", hint=hint)
    backend: Backend = TorchReferenceBackend() if name in ("auto", "torch_reference") else get_backend(name)
    supported = tuple(getattr(backend, "supported_dtypes", ()) or ())
    if supported and plan.alternative_dtype not in supported:
        raise ValidationError(f"calibration backend {backend.name!r} cannot run the alternative's dtype "
                              f"{plan.alternative_dtype!r}", hint=hint)
    return backend


def replay_noise(plan: ValidationPlan, key: CheckpointKey, reference: Capture, calibration: Capture | None,
                 comparison: ComparisonResult | None) -> RatioVerdict | None:
    """The calibrated verdict of the alternative's replay at ``key`` (``comparison``), measured by
    the calibration's replay of the same layer on the same input (None where ``key`` is judged by a
    tolerance or there is no calibrated replay)."""
    if comparison is None or calibration is None or key not in calibration or key not in reference:
        return None
    if not plan.calibrated(key) or (comparison.numel == 0 and not comparison.passed):  # no replayed tensor
        return None
    noise = compare(reference[key], calibration[key], check_dtype=False, name=f"{key} replayed (calibration)")
    return judge_by_noise(plan, reference[key], noise, comparison, what=" replaying the layer")


def noise_at(key: CheckpointKey, reference: Capture, calibration: Capture | None) -> ComparisonResult | None:
    """The calibration run against the reference at ``key`` (None without it)."""
    if calibration is None or key not in calibration or key not in reference:
        return None
    return compare(reference[key], calibration[key], check_dtype=False, name=f"{key} (calibration)")
