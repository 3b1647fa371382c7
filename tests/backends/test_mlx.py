"""MLX (Llama family, BERT) agrees with PyTorch float32 at every checkpoint, and runs the reference's
own step functions; fast on tiny models."""

from __future__ import annotations

import numpy as np
import pytest

from debug_framework.backends import get_backend
from debug_framework.capture import CheckpointKey, CheckpointSelection, all_checkpoints
from debug_framework.comparison import Tolerance, compare
from debug_framework.modelio import ModelInputs, load_model

#: two float32 implementations on O(1) activations, <= 4 layers: observed max error ~1.5e-6.
FP32 = dict(rtol=1e-5, atol=1e-5)


def _both(path, inputs, dtype="float32", taps=None):
    model = load_model(path)
    ref = get_backend("pytorch")
    ref.prepare(model, "float32", "cpu")
    alt = get_backend("mlx")
    alt.prepare(model, dtype)
    return model, ref.run(inputs, taps), alt, alt.run(inputs, taps)


@pytest.mark.parametrize("fixture", ["tiny_qwen2", "tiny_llama", "tiny_bert"])
def test_mlx_agrees_with_pytorch_at_every_checkpoint(request, fixture, random_inputs):
    model, a, alt, b = _both(request.getfixturevalue(fixture), random_inputs)
    assert list(a) == list(b) == all_checkpoints(model.num_layers)
    for key in a:  # padded positions included: both implement the same mask
        res = compare(a[key].numpy(), b[key], **FP32)
        assert res.passed, (key, res.reason, res.max_abs_error)
    assert b.backend == "mlx" and b.dtype == "float32" and b.elapsed_s > 0 and b.meta["device"] in ("cpu", "gpu")


def test_mlx_subset_layer_inputs_and_single_layer_replay(tiny_qwen2, random_inputs):
    model = load_model(tiny_qwen2)
    alt = get_backend("mlx")
    alt.prepare(model, "float32")
    sel = CheckpointSelection(names={"post_mlp"}, layers=(1, 3))
    got = alt.run(random_inputs, sel, capture_layer_inputs=True)
    assert list(got) == [CheckpointKey("post_mlp", 1), CheckpointKey("post_mlp", 2)]
    assert sorted(got.layer_inputs) == [0, 1, 2, 3]
    replay = alt.run_layer(2, got.layer_inputs[2], random_inputs)
    assert np.array_equal(replay["post_mlp:2"], got["post_mlp:2"])
    assert len(alt.run(random_inputs, [])) == 0  # nothing asked, nothing returned (the model still ran)


def test_mlx_bfloat16_is_bfloat16(tiny_qwen2, random_inputs):
    """bf16 really computes in bf16: within bf16 tolerance, outside float32's."""
    model, a, _, b = _both(tiny_qwen2, random_inputs, "bfloat16")
    bf16, fp32 = Tolerance(rtol=1.6e-2, atol=5e-2), Tolerance(rtol=1.3e-6, atol=1e-5)
    import torch

    final = CheckpointKey("post_processing")
    assert b[final].dtype == torch.bfloat16  # NumPy has no bfloat16: handed over as a torch tensor
    assert compare(a[final], b[final], tolerance=bf16, check_dtype=False).passed
    assert not compare(a[final], b[final], tolerance=fp32, check_dtype=False).passed


def test_mlx_on_other_input_shapes(tiny_bert):
    inputs = ModelInputs.random(128, batch=3, length=20, seed=2, pad_lengths=[5, 0, 19])
    inputs.token_type_ids = np.concatenate([np.zeros((3, 10), np.int64), np.ones((3, 10), np.int64)], axis=1)
    _, a, _, b = _both(tiny_bert, inputs)
    for key in a:
        assert compare(a[key].numpy(), b[key], **FP32).passed, key


@pytest.mark.parametrize("fixture, family, step", [("tiny_qwen2", "llama", "rms_norm"), ("tiny_bert", "bert", "layer_norm")])
def test_mlx_runs_the_reference_step_functions(request, fixture, family, step, random_inputs, monkeypatch):
    """One model definition: python_reference and mlx run the same class and call the same step
    function, once with NumPy arrays and once with MLX arrays, as many times each."""
    import importlib

    from debug_framework.architectures.xp import array_namespace

    module = importlib.import_module(f"debug_framework.architectures.{family}")
    real, seen = getattr(module, step), []

    def spy(x, *args):
        seen.append(array_namespace(x).name)
        return real(x, *args)

    monkeypatch.setattr(module, step, spy)
    model = load_model(request.getfixturevalue(fixture))
    ref, alt = get_backend("python_reference"), get_backend("mlx")
    ref.prepare(model, "float32")
    alt.prepare(model, "float32")
    assert type(ref.reference) is type(alt.net) and alt.net.xp.name == "mlx" and ref.reference.xp.name == "numpy"
    ref.run(random_inputs)
    n = len(seen)
    alt.run(random_inputs)
    assert n > model.num_layers and seen == ["numpy"] * n + ["mlx"] * n


@pytest.mark.parametrize("fixture", ["tiny_qwen2", "tiny_llama", "tiny_bert"])
def test_mlx_agrees_with_the_float32_reference_at_every_checkpoint(request, fixture, random_inputs):
    """The same step functions in float32 on two array libraries: agreement to a few float32 ulp."""
    model = load_model(request.getfixturevalue(fixture))
    ref, alt = get_backend("python_reference"), get_backend("mlx")
    ref.prepare(model, "float32")
    alt.prepare(model, "float32")
    a, b = ref.run(random_inputs), alt.run(random_inputs)
    assert list(a) == list(b) == all_checkpoints(model.num_layers)
    for key in a:
        assert a[key].dtype == b[key].dtype == np.float32, key
        res = compare(a[key], b[key], **FP32)
        assert res.passed, (key, res.reason, res.max_abs_error)
