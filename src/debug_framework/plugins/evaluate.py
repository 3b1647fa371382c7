"""Judging one sample: the kernel against the reference run in float64, relative to the reference
run in the kernel's own dtype (the comparison core's ratio rule, as KernelDiff's float64 mode).

    err(kernel, float64 reference) <= 2 x err(reference in the kernel's dtype, float64 reference) + 1e-5

on the RMSE over finite values; a kernel may not have more non-finite mismatches (NaN where the
reference has a number...) than the reference in its dtype has, and its output must have the
reference's shape and dtype. A sample the reference itself rejects is ``skipped``; a kernel that
raises is ``error``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..comparison import RatioRule, compare
from .loading import LoadedKernel
from .samples import Sample, on_device, upcast

__all__ = ["RULE", "evaluate_sample", "badness"]

#: The rule every sample is judged by.
RULE = RatioRule(multiplier=2.0, floor=1e-5, metric="rmse")


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
    verdict = RULE.verdict(base_cmp, test_cmp, oracle="the float64 reference",
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
