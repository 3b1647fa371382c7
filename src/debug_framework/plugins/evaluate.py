"""Judging one sample: the kernel against the reference run in float64, relative to the reference
run in the kernel's own dtype, by the calibrated rule the validation engine judges checkpoints by
(:meth:`debug_framework.comparison.RatioRule.calibrated`):

    err(kernel, float64 reference) <= 4 x err(reference in the kernel's dtype, float64 reference)
                                      + 1 x eps(kernel's dtype) x RMS(float64 reference)

(for a float64 kernel the reference in float64 is the oracle itself, so the floor is 16 eps x RMS)

on the RMSE over finite values, widened where it is exceeded by the noise the reference in the
kernel's dtype has on inputs perturbed within rounding (the noise rule,
:func:`debug_framework.comparison.judge_with_noise`; the result's ``noise`` records it) (the floor is relative to the sample's scale, so a kernel that is
wrong on small values is caught as surely as on large ones); a kernel may not have more non-finite mismatches (NaN where the
reference has a number...) than the reference in its dtype has, and its output must have the
reference's shape and dtype. A sample the reference itself rejects is ``skipped``; a kernel that
raises is ``error``.

Samples at the edge of a dtype's range are judged for what they are (:func:`_at_scale`): the three
outputs are scaled by one power of two (exact) that brings the float64 reference near 1 before they
are compared, so the squared errors of values near 1e307 (or of subnormals) neither overflow to an
RMSE of inf nor underflow to 0; the rule is scale-free, and the errors reported are scaled back. A
kernel value that is infinite where the float64 reference is finite counts against it (an overflow
the reference does not have), unless the reference's value rounds to the same infinity in the
kernel's dtype within the rule's floor (an overflow it has too, at the edge of the range).
"""

from __future__ import annotations

import math
import torch

from ..comparison import FLOOR_EPS, ComparisonResult, RatioRule, compare, judge_with_noise, perturb_within_rounding
from ..jsonio import JsonObject
from .loading import LoadedKernel
from .samples import Sample, on_device, upcast

__all__ = ["sample_rule", "evaluate_sample", "badness", "error_text", "STATUS_RANK"]


#: A float64 kernel has no more precise oracle: the reference in float64 *is* the oracle, its error
#: is 0, and the kernel is allowed this many eps x RMS (a few ulps of a different summation order).
FLOAT64_FLOOR_EPS = 16.0


def sample_rule(oracle: torch.Tensor, dtype: str) -> RatioRule:
    """The rule one sample is judged by: calibrated at the epsilon of the sample's dtype (the
    precision the kernel was asked to compute in, whatever dtype it returns) and the oracle's scale."""
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        return RatioRule.calibrated(oracle, 0.0)
    floor_eps = FLOAT64_FLOOR_EPS if torch_dtype == torch.float64 else FLOOR_EPS
    return RatioRule.calibrated(oracle, torch.finfo(torch_dtype).eps, floor_eps=floor_eps)


def _first_tensor(out: object) -> torch.Tensor | None:
    """The output itself, or the first of a tuple or list of tensors (the one a kernel is judged by)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def error_text(exc: BaseException) -> str:
    """An exception as one line of a sample's reason: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def evaluate_sample(kernel: LoadedKernel, sample: Sample) -> JsonObject:
    """The verdict of one sample: ``status`` (pass/fail/error/skipped), ``reason``, the errors weighed."""
    device = kernel.spec.devices[0]
    if device != "cpu":  # samples are made on CPU; a CUDA kernel runs (and is judged) on its device
        sample = Sample(sample.source, sample.label, sample.dtype, on_device(sample.args, device),
                        on_device(sample.kwargs, device))
    try:
        oracle = _first_tensor(kernel.reference(*upcast(sample.args), **upcast(sample.kwargs)))
        baseline = _first_tensor(kernel.reference(*sample.args, **sample.kwargs))
    except Exception as exc:  # noqa: BLE001 - the reference rejects the sample: it does not apply
        return {"status": "skipped", "reason": f"the reference rejects this sample ({error_text(exc)})"}
    if oracle is None or baseline is None:
        return {"status": "skipped", "reason": "the reference returns no tensor"}
    try:
        with torch.inference_mode():
            out = _first_tensor(kernel.op(*sample.args, **sample.kwargs))
    except Exception as exc:  # noqa: BLE001 - the kernel's failure is the verdict
        return {"status": "error", "reason": f"the kernel raised {error_text(exc)}"}
    if out is None:
        return {"status": "fail", "reason": "the kernel returned no tensor"}
    if out.dtype != baseline.dtype:
        return {"status": "fail", "reason": f"the kernel returns {out.dtype}, the reference {baseline.dtype}"}
    if out.shape != oracle.shape:
        scale, edge = 1.0, 0
    else:
        oracle, baseline, out, scale, edge = _at_scale(oracle, baseline, out, sample.dtype)
    base_cmp = compare(oracle, baseline, check_dtype=False, equal_nan=True)
    test_cmp = compare(oracle, out, check_dtype=False, equal_nan=True)
    noisy_oracle = oracle

    def measure(seed: int) -> ComparisonResult | None:
        """The reference in the sample's dtype on inputs perturbed within rounding, against the oracle."""
        noisy = _first_tensor(kernel.reference(*perturb_within_rounding(list(sample.args), seed),
                                               **perturb_within_rounding(dict(sample.kwargs), seed)))
        if noisy is None or noisy.shape != noisy_oracle.shape:
            return None
        return compare(noisy_oracle, _scaled(noisy, scale), check_dtype=False, equal_nan=True)

    verdict, evidence = judge_with_noise(sample_rule(oracle, sample.dtype), base_cmp, test_cmp, measure,
                                         oracle="the float64 reference",
                                         baseline_name=f"the reference in {sample.dtype}")
    j = verdict.judgement
    reason = verdict.reason
    if reason and scale != 1.0:
        reason += f" (errors measured at scale 2^{-round(math.log2(scale))}, reported unscaled)"
    if edge:
        reason = (f"{reason}; " if reason else "") + (
            f"{edge} value(s) where the float64 reference is within rounding of {sample.dtype}'s "
            "largest value and the kernel rounds to infinity are not counted")
    return {"status": "pass" if verdict.passed else "fail", "reason": reason,
            "kernel_error": j.alternative_error / scale, "reference_error": j.reference_error / scale,
            "bound": j.bound / scale, "max_abs_error": _unscaled(test_cmp.max_abs_error, scale),
            "shape": list(out.shape), "nonfinite_mismatches": test_cmp.nonfinite_mismatch_count,
            **({"reference_error": evidence.single_run_error / scale,
                "noise": {**evidence.to_dict(), "errors": [e / scale for e in evidence.errors],
                          "noise": evidence.noise / scale, "single_run_error": evidence.single_run_error / scale,
                          "single_run_bound": evidence.single_run_bound / scale, "bound": evidence.bound / scale}}
               if evidence is not None else {})}


def _unscaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value / scale


def _at_scale(oracle: torch.Tensor, baseline: torch.Tensor, out: torch.Tensor,
              dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int]:
    """The three outputs multiplied by the power of two ``scale`` that brings the float64
    reference's largest finite magnitude into [0.5, 1) (exact for normal values), and the number of
    edge overflows taken out: positions where the kernel is infinite, the reference is finite with
    the same sign, and the reference's magnitude is within the rule's floor of ``dtype``'s largest
    finite value (its value rounds to that infinity as easily as to the largest value)."""
    finite = oracle[torch.isfinite(oracle)]
    peak = float(finite.abs().max()) if finite.numel() else 0.0
    scale = 1.0 if peak == 0.0 else 2.0 ** -min(max(math.frexp(peak)[1], -1000), 1024)
    torch_dtype = getattr(torch, dtype, None)
    edge = 0
    if isinstance(torch_dtype, torch.dtype) and torch_dtype.is_floating_point and out.dtype.is_floating_point:
        info = torch.finfo(torch_dtype)
        floor = FLOAT64_FLOOR_EPS if torch_dtype == torch.float64 else FLOOR_EPS
        near = oracle.abs().to(torch.float64) >= info.max * (1.0 - floor * info.eps)
        mask = torch.isinf(out) & torch.isfinite(oracle) & near & (torch.sign(out.to(oracle.dtype)) == torch.sign(oracle))
        edge = int(mask.sum())
        if edge:  # the same position in every output reads 0: neither counted nor measured
            oracle, baseline, out = (t.masked_fill(mask, 0) for t in (oracle, baseline, out))
    if scale == 1.0:
        return oracle, baseline, out, scale, edge
    return (*(_scaled(t, scale) for t in (oracle, baseline, out)), scale, edge)


def _scaled(t: torch.Tensor, scale: float) -> torch.Tensor:
    """``t * scale`` computed in float64 and returned in ``t``'s dtype (a power of two: exact while
    the result is a normal number of that dtype)."""
    return (t.to(torch.float64) * scale).to(t.dtype) if t.is_floating_point() else t


#: The ranks of a sample's status in :func:`badness`: a status outranks every sample of a lower one,
#: whatever their numbers (a sample that fails on non-finite values alone, with a small RMSE, is
#: still worse than every passing sample).
STATUS_RANK = {"crash": 4, "hang": 4, "error": 3, "fail": 2, "pass": 1}


def badness(result: JsonObject, *, error_key: str = "kernel_error",
            unranked: tuple[str, ...] = ("skipped",)) -> tuple[int, float]:
    """How bad a sample's result is, to pick the worst (compare with ``max``): its status first
    (crashes and hangs, errors, failures, passes, :data:`STATUS_RANK`), then, within a status,
    error / bound. ``error_key`` names the result's measured error (the operator sweep's
    ``backend_error``); a status in ``unranked`` (a sample not judged) ranks last. A failure with no
    measure (another shape or dtype, no finite value) ranks above measured failures."""
    status = result.get("status")
    if status in unranked or status not in STATUS_RANK:
        return (0, -math.inf)
    rank = STATUS_RANK[status]
    if rank > STATUS_RANK["fail"]:
        return (rank, 0.0)
    err, bound = result.get(error_key), result.get("bound")
    if not isinstance(err, int | float) or not isinstance(bound, int | float) or math.isnan(err):
        return (rank, math.inf if status == "fail" else -1.0)
    if math.isinf(err):
        return (rank, 1e300)
    return (rank, err / bound if bound > 0 else (0.0 if err == 0 else 1e299))
