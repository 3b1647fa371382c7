"""Calibration: the measurements each checkpoint's calibrated bound is made of.

A trusted implementation at the alternative's precision (by default ``torch_reference``: the
reference models run through torch in that dtype) runs on the same inputs. Its error against the
reference at a checkpoint is the *noise* a correct implementation at that precision makes there;
the alternative passes when

    err(alternative, reference) <= noise_margin * err(calibration, reference) + floor,
    floor = floor_eps * eps(dtype) * RMS(reference tensor)

by the project's one ratio verdict (:meth:`debug_framework.comparison.RatioRule.verdict`, metric
``calibration_metric``), applied by the judge (:mod:`.judge`). Block replays (isolation) are
calibrated the same way: the trusted implementation replays each block on the same reference
input. Explicit tolerances (``precision_thresholds``) win where given; ``calibrate: false`` turns
it off. This module only measures: the noise, the tolerance margin, and which backend is trusted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...backends.base import Backend
from ...backends.capabilities import capabilities, emulated_precision
from ...capture.keys import Capture, CheckpointKey
from ...comparison import ComparisonResult, Tolerance, compare, float64_array
from ...errors import ConfigurationError
from .plan import ValidationPlan

if TYPE_CHECKING:
    from ...modelio import LoadedModel

__all__ = ["tolerance_margin", "calibration_backend", "calibration_dtype", "noise_at"]


def tolerance_margin(reference: object, alternative: object, tol: Tolerance) -> float | None:
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


def calibration_backend(plan: ValidationPlan, alternative_backend: str, model: LoadedModel | None = None,
                        alternative: Backend | None = None) -> Backend:
    """The trusted implementation of a session (``calibration_backend``), checked: it may not be
    the alternative itself and must run the alternative's dtype (DF005 saying what to pass).
    ``"auto"`` is ``torch_reference`` (the from-math models through torch), or for a generic-tier
    ``model`` the model's own eager code at the alternative's precision (``float64_eager``'s code),
    or, where the session's ``emulated_precision`` is set (``dtype: "auto"`` and an engine declaring a
    precision it emulates, :func:`~debug_framework.backends.capabilities.emulated_precision`: llama.cpp's
    ``q8_0``, a module's torchao ``int8_weight_only``), the ``alternative``'s emulation of it."""
    from ...backends import get_backend
    from ...backends.torch_reference import TorchReferenceBackend

    if plan.config.calibration_backend == "auto" and plan.config.emulated_precision and alternative is not None \
            and model is not None:
        emulated = emulated_precision(alternative, model)
        if emulated is not None:
            return emulated.trusted_backend()

    if plan.config.calibration_backend == "auto" and getattr(model, "architecture", None) == "generic":
        from ...backends.eager_reference import EagerReferenceBackend

        return EagerReferenceBackend()

    name = plan.config.calibration_backend
    hint = ("leave calibration_backend 'auto' (torch_reference: the reference models through torch), "
            "or set calibrate to false (then the dtype's fixed tolerances apply)")
    if name == alternative_backend:
        raise ConfigurationError(f"calibration_backend {name!r} is the alternative itself: a backend cannot "
                              "calibrate its own judgement", hint=hint)
    backend: Backend = TorchReferenceBackend() if name in ("auto", "torch_reference") else get_backend(name)
    supported = capabilities(backend).dtypes
    if supported and plan.alternative_dtype not in supported:
        raise ConfigurationError(f"calibration backend {backend.name!r} cannot run the alternative's dtype "
                              f"{plan.alternative_dtype!r}", hint=hint)
    return backend


def calibration_dtype(plan: ValidationPlan, model: LoadedModel | None = None) -> str:
    """The calibration run's dtype: the alternative's; but on the generic tier with a reference not
    in float64 (``--reference-backend pytorch``: the very code the calibration would run), float64,
    so that the noise is how far a correct run (the exact one) lands from the reference."""
    if getattr(model, "architecture", None) == "generic" and plan.reference_dtype != "float64" \
            and plan.config.calibration_backend == "auto":
        return "float64"
    return plan.alternative_dtype


def noise_at(key: CheckpointKey, reference: Capture, calibration: Capture | None, *,
             positions: np.ndarray | None = None) -> ComparisonResult | None:
    """The calibration run against the reference at ``key`` (None without it), over the model
    ``positions`` (padded positions left out)."""
    if calibration is None or key not in calibration or key not in reference:
        return None
    return compare(reference[key], calibration[key], check_dtype=False, name=f"{key} (calibration)",
                   positions=positions)
