"""Samples at the edge of a dtype's range (issue 30, item 1): a kernel a few ulps from the reference
on outputs near 1e307 passes (its squared error no longer overflows to an RMSE of inf); an overflow
the reference does not have fails; one at the very edge, where the reference's value rounds to the
same infinity, does not. The samples' tensor order follows the operator's schema, whatever the
manifest's key order (a manifest read back from the database has sorted keys)."""

from __future__ import annotations

import dataclasses

import torch

from debug_framework.plugins.evaluate import evaluate_sample
from debug_framework.plugins.loading import LoadedKernel
from debug_framework.plugins.manifest import load_manifest
from debug_framework.plugins.samples import Sample, make_samples

from .conftest import EXAMPLES

SPEC = load_manifest(EXAMPLES / "cpp").kernel("rms_norm")
F64 = torch.finfo(torch.float64)


def _reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.to(x.dtype)


def _kernel(op) -> LoadedKernel:
    return LoadedKernel(SPEC, op, _reference, None, [])


def _large_w_sample() -> Sample:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 17, dtype=torch.float64)
    w = torch.randn(17, dtype=torch.float64) * (F64.max / 8)
    return Sample("special", "large in w", "float64", [x, w, 1e-6])


def test_a_kernel_ulps_from_the_reference_on_huge_outputs_passes():
    two_ulps = _kernel(lambda x, w, eps: _reference(x, w, eps) * (1 + 2 ** -51))
    result = evaluate_sample(two_ulps, _large_w_sample())
    assert result["status"] == "pass", result
    assert 0 < result["kernel_error"] < float("inf") and result["kernel_error"] <= result["bound"]


def test_a_kernel_wrong_on_huge_outputs_still_fails():
    wrong = _kernel(lambda x, w, eps: _reference(x, w, eps) * 1.001)
    assert evaluate_sample(wrong, _large_w_sample())["status"] == "fail"


def _one_value(kernel_value: float, ref_value: float) -> dict:
    x = torch.tensor([[ref_value / 2, 1.0]], dtype=torch.float64)
    kernel = LoadedKernel(SPEC, lambda x, w, eps: torch.where(torch.arange(2) == 0, kernel_value, x * w),
                          lambda x, w, eps: x * w, None, [])
    return evaluate_sample(kernel, Sample("special", "edge", "float64", [x, torch.tensor([2.0, 1.0],
                                                                                        dtype=torch.float64), 0.0]))


def test_an_overflow_the_reference_does_not_have_fails_one_at_the_edge_does_not():
    assert _one_value(float("inf"), 1e300)["status"] == "fail"
    at_edge = _one_value(float("inf"), F64.max * (1 - 2 * F64.eps))
    assert at_edge["status"] == "pass" and "not counted" in at_edge["reason"]
    assert _one_value(float("-inf"), F64.max * (1 - 2 * F64.eps))["status"] == "fail"  # the wrong infinity


def test_the_sample_order_follows_the_schema_not_the_manifest_keys():
    reordered = dataclasses.replace(SPEC, inputs={"w": SPEC.inputs["w"], "x": SPEC.inputs["x"]})
    labels = [s.label for s in make_samples(reordered, opinfo=False) if s.source == "special"]
    assert labels == [s.label for s in make_samples(SPEC, opinfo=False) if s.source == "special"]
    assert "large in x" in labels
