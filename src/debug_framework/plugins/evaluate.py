"""Judging one sample: the kernel against the reference run in float64, relative to the reference
run in the kernel's own dtype, by the calibrated rule the validation engine judges checkpoints by
(:meth:`debug_framework.comparison.RatioRule.calibrated`):

    err(kernel, float64 reference) <= 4 x err(reference in the kernel's dtype, float64 reference)
                                      + 1 x eps(kernel's dtype) x RMS(float64 reference)

(for a float64 kernel the reference in float64 is the oracle itself, so the floor is 16 eps x RMS)

on the RMSE over finite values (the floor is relative to the sample's scale, so a kernel that is
wrong on small values is caught as surely as on large ones); a kernel may not have more non-finite mismatches (NaN where the
reference has a number...) than the reference in its dtype has, and its output must have the
reference's shape and dtype. A sample the reference itself rejects is ``skipped``; a kernel that
raises is ``error``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..comparison import FLOOR_EPS, RatioRule, compare
from .loading import LoadedKernel
from .samples import Sample, on_device, upcast

__all__ = ["sample_rule", "evaluate_sample", "badness"]


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


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def evaluate_sample(kernel: LoadedKernel, sample: Sample) -> dict[str, Any]:
    """The verdict of one sample: ``status`` (pass/fail/error/skipped), ``reason``, the errors weighed."""
    device = kernel.spec.devices[0]
    if device != "cpu":  # samples are made on CPU; a CUDA kernel runs (and is judged) on its device
        sample = Sample(sample.source, sample.label, sample.dtype, on_device(sample.args, device),
                        on_device(sample.kwargs, device))
    try:
        oracle = _first_tensor(kernel.reference(*upcast(sample.args), **upcast(sample.kwargs)))
        baseline = _first_tensor(kernel.reference(*sample.args, **sample.kwargs))
    except Exception as exc:  # noqa: BLE001 - the reference rejects the sample: it does not apply
        return {"status": "skipped", "reason": f"the reference rejects this sample ({_error(exc)})"}
    if oracle is None or baseline is None:
        return {"status": "skipped", "reason": "the reference returns no tensor"}
    try:
        with torch.inference_mode():
            out = _first_tensor(kernel.op(*sample.args, **sample.kwargs))
    except Exception as exc:  # noqa: BLE001 - the kernel's failure is the verdict
        return {"status": "error", "reason": f"the kernel raised {_error(exc)}"}
    if out is None:
        return {"status": "fail", "reason": "the kernel returned no tensor"}
    if out.dtype != baseline.dtype:
        return {"status": "fail", "reason": f"the kernel returns {out.dtype}, the reference {baseline.dtype}"}
    base_cmp = compare(oracle, baseline, check_dtype=False, equal_nan=True)
    test_cmp = compare(oracle, out, check_dtype=False, equal_nan=True)
    verdict = sample_rule(oracle, sample.dtype).verdict(base_cmp, test_cmp, oracle="the float64 reference",
                           baseline_name=f"the reference in {sample.dtype}")
    j = verdict.judgement
    return {"status": "pass" if verdict.passed else "fail", "reason": verdict.reason,
            "kernel_error": j.alternative_error, "reference_error": j.reference_error, "bound": j.bound,
            "max_abs_error": test_cmp.max_abs_error, "shape": list(out.shape),
            "nonfinite_mismatches": test_cmp.nonfinite_mismatch_count}


def badness(result: dict[str, Any]) -> float:
    """How bad a sample's result is, to pick the worst: crashes and errors first, then error / bound."""
    status = result.get("status")
    if status in ("crash", "hang"):
        return math.inf
    if status == "error":
        return 1e300
    if status == "skipped":
        return -math.inf
    err, bound = result.get("kernel_error"), result.get("bound")
    if err is None or bound is None or (isinstance(err, float) and math.isnan(err)):
        return 1e299 if status == "fail" else -1.0
    if math.isinf(err):
        return 1e298
    return err / bound if bound > 0 else (0.0 if err == 0 else 1e297)
