"""Model-level swap-in: the PyTorch model with a plugin's kernels, validated as backend
``plugin:<id>``; the wrong rms_norm is caught at the first layer that uses it."""

from __future__ import annotations

import pytest
import torch

from debug_framework.plugins.loading import load_plugin
from debug_framework.plugins.swap import AtenSwap, record_op_shapes


def _session(tmp_path, engine, manifest, model):
    from debug_framework.services.plugin_registry import PluginRegistry
    from debug_framework.services.validation_engine import ValidationEngine

    validation = ValidationEngine(tmp_path / "s.db")
    backend = PluginRegistry(validation.db, engine=engine).swap_in(manifest)
    sid = validation.create_session(model, {"isolate": True}, "python_reference", backend)
    return backend, validation.run(sid)


@pytest.mark.slow
def test_the_wrong_rms_norm_diverges_at_the_first_layer_that_uses_it(buggy_build, engine, llama_dir, tmp_path):
    from .conftest import EXAMPLES

    backend, result = _session(tmp_path, engine, EXAMPLES / "cpp_buggy" / "plugin.json", llama_dir)
    assert backend == "plugin:example-cpp-buggy"
    assert result.verdict == "failed"
    first = result.first_divergence
    assert (first.key.name, first.key.layer) == ("post_attention", 0)  # layer 0's input_layernorm is the first use
    assert 0 in result.introducing_layers


@pytest.mark.slow
def test_the_correct_plugin_passes_and_its_kernels_ran(cpp_build, engine, llama_dir, tmp_path):
    from debug_framework.backends import get_backend
    from debug_framework.modelio import ModelInputs, load_model

    from .conftest import EXAMPLES

    backend, result = _session(tmp_path, engine, EXAMPLES / "cpp" / "plugin.json", llama_dir)
    assert result.verdict == "passed", result.to_dict()["first_divergence"]
    alt = get_backend(backend)
    alt.prepare(load_model(llama_dir), "float32")
    alt.run(ModelInputs.random(128, 1, 8))
    assert alt.calls["rms_norm"] == 3 * 2 + 1  # two norms per layer and the final one


@pytest.mark.slow
def test_aten_kernels_swap_in_only_inside_the_mode_and_for_their_dtypes(cpp_build):
    defn, build = cpp_build
    kernels = list(load_plugin(defn, build.artifact).values())
    x = torch.randn(4, 5)
    with AtenSwap(kernels) as mode:
        y = torch.nn.functional.gelu(x)
        torch.nn.functional.gelu(x.half())  # float16 is not among the kernel's dtypes
    assert mode.calls == {"gelu": 1}
    assert torch.equal(y, torch.ops.df_example.gelu(x))
    torch.nn.functional.gelu(x)
    assert mode.calls == {"gelu": 1}


@pytest.mark.slow
def test_shapes_recorded_from_a_real_model_run(cpp_build, llama_dir):
    from debug_framework.backends.pytorch import build_hf_model
    from debug_framework.modelio import ModelInputs, load_model

    defn, build = cpp_build
    net = build_hf_model(load_model(llama_dir), torch.float32, "cpu")
    kernels = list(load_plugin(defn, build.artifact).values())
    inputs = ModelInputs.random(128, 2, 16).torch("cpu")
    shapes = record_op_shapes(net, kernels, lambda: net(**inputs))
    assert shapes["rms_norm"] == [{"x": [2, 16, 64], "w": [64]}]
    assert shapes["gelu"] == []  # Llama's MLP uses SiLU
