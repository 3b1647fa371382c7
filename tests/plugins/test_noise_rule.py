"""The plugin sweep's judge (evaluate_sample) with the noise rule (issue 48, item 13): on an
ill-conditioned output a kernel that rounds differently from the reference passes once the reference's
noise on inputs perturbed within rounding is measured; a wrong kernel still fails."""

from __future__ import annotations

import torch

from debug_framework.plugins.evaluate import evaluate_sample
from debug_framework.plugins.loading import LoadedKernel
from debug_framework.plugins.samples import Sample

from .test_sample_edges import SPEC


def _cond(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """An ill-conditioned reference: the condition number of each 6x6 matrix of ``x`` (``w``, ``eps`` unused)."""
    return torch.linalg.cond(x)


def _sample() -> Sample:
    g = torch.Generator().manual_seed(7)
    u, _ = torch.linalg.qr(torch.randn(4, 6, 6, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(4, 6, 6, generator=g, dtype=torch.float64))
    a = (u * torch.logspace(0, -6, 6, dtype=torch.float64)) @ v.transpose(-1, -2)
    return Sample("special", "ill-conditioned", "float32", [a.float(), torch.ones(6), 1e-6])


def test_a_kernel_rounding_differently_passes_with_the_widening_recorded():
    kernel = LoadedKernel(SPEC, lambda x, w, eps: torch.linalg.cond(x.flip(-2)), _cond, None, [])
    result = evaluate_sample(kernel, _sample())
    assert result["status"] == "pass", result
    assert result["noise"]["widened"] and result["kernel_error"] > result["noise"]["single_run_bound"]
    assert result["bound"] == result["noise"]["bound"] and result["reference_error"] == result["noise"]["single_run_error"]


def test_a_wrong_kernel_still_fails():
    kernel = LoadedKernel(SPEC, lambda x, w, eps: torch.linalg.cond(x) * 1.2, _cond, None, [])
    result = evaluate_sample(kernel, _sample())
    assert result["status"] == "fail" and "perturbed within rounding" in result["reason"]
