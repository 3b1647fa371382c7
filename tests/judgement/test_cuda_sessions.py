"""Sessions whose alternative runs on a CUDA GPU: the calibrated judgement holds there (correct
backends pass in every dtype, an injected layer bug is found in its layer), Inductor compiles for the
GPU, and the session records the GPU. Skipped, with the reason, on a machine without CUDA (CI has
none; these ran on an NVIDIA H200 lent to a development session).

The calibration's trusted run stays on the CPU; what these tests check is that a GPU's own rounding
(cuBLAS's accumulation order and split-K, reduced-precision GEMM paths) stays inside bounds
calibrated from it, and that bugs are still seen through them.
"""

from __future__ import annotations

import pytest
import torch

from debug_framework.backends import unregister_backend

from benchmarks.injected_bugs import BUG_LAYER, expected_first, register_bug_backend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_correct_cuda_backend_passes(engine, tiny_models, family, dtype):
    model = tiny_models(family, 0)
    result = engine.run(engine.create_session(model, {"dtype": dtype, "device": "cuda"}, "python_reference", "cuda"))
    assert result.verdict == "passed", [(o.key, o.margin) for o in result.results if not o.passed]
    worst = max(o.margin for o in result.results)
    print(f"cuda {family} {dtype}: worst margin {worst:.3f}")
    environment = engine.get_session_results(result.session_id)["session"]["environment"]
    assert environment["gpu"] == torch.cuda.get_device_name(0) and environment["cuda"] == torch.version.cuda


@pytest.mark.parametrize("bug,family", [("attention_scale", "llama"), ("dropped_norm_weight", "llama"),
                                       ("kv_head_mapping", "llama"), ("gelu_variant", "bert")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_injected_bug_on_cuda_is_found_in_its_layer(engine, tiny_models, bug, family, dtype):
    if bug == "gelu_variant" and dtype != "float32":
        pytest.skip("the GELU variant is inside a correct bfloat16 run's own noise (see tests/judgement)")
    name = register_bug_backend(bug)
    try:
        model = tiny_models(family, 0)
        result = engine.run(engine.create_session(model, {"dtype": dtype, "device": "cuda"}, "python_reference", name))
    finally:
        unregister_backend(name)
    assert result.verdict == "failed"
    assert result.first_divergence.key == expected_first(bug)
    assert result.introducing_layers == [BUG_LAYER]


def test_inductor_on_cuda_passes(engine, tiny_models):
    model = tiny_models("llama", 0)
    result = engine.run(engine.create_session(model, {"dtype": "float32", "device": "cuda"}, "python_reference", "inductor"))
    assert result.verdict == "passed", [(o.key, o.margin) for o in result.results if not o.passed]
