"""Backends agree with the reference on tiny random Llama-family models; registry; user backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_framework.backends import (
    backend_availability,
    detect_available_backends,
    get_backend,
    module_backend,
    register_backend,
    unregister_backend,
    user_backend,
)
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.capture import CheckpointKey, CheckpointSelection, all_checkpoints
from debug_framework.comparison import Tolerance, compare
from debug_framework.errors import BackendInitializationError
from debug_framework.modelio import ModelInputs, load_model

#: float64 reference vs float32 eager torch on O(1) activations, 4 layers: observed ~1e-6.
FP32_AGREEMENT = dict(rtol=1e-5, atol=1e-5)
#: bfloat16 keeps ~3 significant digits; rtol is torch's bf16 default, atol covers rounding
#: accumulated over 4 layers on O(1) activations near zero.
BF16 = Tolerance(rtol=1.6e-2, atol=5e-2)


def _pair(path, dtype="float32"):
    model = load_model(path)
    ref = get_backend("python_reference")
    ref.prepare(model, "float64")
    alt = get_backend("pytorch")
    alt.prepare(model, dtype, "cpu")
    return model, ref, alt


@pytest.mark.parametrize("fmt", ["hf", "zt"])
def test_tiny_qwen2_gqa_llama3_qkv_bias_agrees_at_every_checkpoint(tiny_qwen2, random_inputs, fmt):
    model, ref, alt = _pair(tiny_qwen2[fmt])
    a, b = ref.run(random_inputs), alt.run(random_inputs)
    assert list(a) == list(b) == all_checkpoints(4)
    for key in a:
        res = compare(a[key], b[key], check_dtype=False, **FP32_AGREEMENT)
        assert res.passed, (key, res.reason, res.max_abs_error)
    assert compare(a["post_processing"], b["post_processing"], check_dtype=False).max_abs_error <= 1e-4
    assert a.dtype == "float64" and b.dtype == "float32" and b.elapsed_s > 0


def test_tied_embeddings_linear_rope_and_o_bias(tiny_llama_tied, random_inputs):
    model, ref, alt = _pair(tiny_llama_tied)
    assert model.config.tie_word_embeddings and model.config.o_bias
    assert "lm_head.weight" not in model.weights
    a, b = ref.run(random_inputs), alt.run(random_inputs)
    for key in a:
        assert compare(a[key], b[key], check_dtype=False, **FP32_AGREEMENT).passed, key


def test_reference_is_sensitive_to_the_rope_scaling(tiny_qwen2, random_inputs):
    """The llama3 scaling is really applied: dropping it changes the outputs beyond tolerance."""
    import dataclasses

    from debug_framework.architectures import LlamaReference
    from debug_framework.modelio import RopeScaling

    model = load_model(tiny_qwen2["hf"])
    plain = dataclasses.replace(model.config, rope_scaling=RopeScaling())
    x = LlamaReference(model.config, model.weights).forward(random_inputs.input_ids, random_inputs.attention_mask)
    y = LlamaReference(plain, model.weights).forward(random_inputs.input_ids, random_inputs.attention_mask)
    assert not compare(x[("post_processing", None)], y[("post_processing", None)], **FP32_AGREEMENT).passed


@pytest.mark.slow  # first bf16 comparison JIT-compiles the comparison kernel (seconds)
def test_bfloat16_fails_float32_tolerance_and_passes_bfloat16(tiny_qwen2, random_inputs):
    _, ref, alt = _pair(tiny_qwen2["hf"], "bfloat16")
    a, b = ref.run(random_inputs), alt.run(random_inputs)
    assert b["post_mlp:0"].dtype == torch.bfloat16
    fp32 = Tolerance(rtol=1.3e-6, atol=1e-5)
    for key in a:
        assert compare(a[key], b[key], check_dtype=False, tolerance=BF16).passed, key
        if key.name != "post_embedding":  # an embedding lookup is exact up to one bf16 rounding
            assert not compare(a[key], b[key], check_dtype=False, tolerance=fp32).passed, key


def test_subset_layer_inputs_and_single_layer_replay(tiny_qwen2, random_inputs):
    _, ref, alt = _pair(tiny_qwen2["hf"])
    sel = CheckpointSelection(names={"post_mlp"}, layers=(1, 3))
    b = alt.run(random_inputs, sel, capture_layer_inputs=True)
    assert list(b) == [CheckpointKey("post_mlp", 1), CheckpointKey("post_mlp", 2)]
    assert sorted(b.layer_inputs) == [0, 1, 2, 3]
    full = alt.run(random_inputs)
    # layer 2 replayed alone from its recorded input reproduces the full run, on both backends
    replay = alt.run_layer(2, b.layer_inputs[2], random_inputs)
    assert torch.equal(replay["post_mlp:2"], full["post_mlp:2"])
    ref_replay = ref.run_layer(2, b.layer_inputs[2], random_inputs)
    assert compare(ref_replay["post_mlp:2"], full["post_mlp:2"], check_dtype=False, **FP32_AGREEMENT).passed
    assert compare(ref_replay["post_attention:2"], full["post_attention:2"], check_dtype=False, **FP32_AGREEMENT).passed


def test_user_module_backend_with_wrong_epsilon_in_layer_2_diverges_first_at_layer_2(tiny_qwen2, random_inputs):
    def wrong_eps(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        net.model.layers[2].input_layernorm.variance_epsilon = 0.5  # the config says 1e-6
        return net

    register_backend("wrong_eps", module_backend("wrong_eps", wrong_eps))
    try:
        model, ref, _ = _pair(tiny_qwen2["hf"])
        user = get_backend("wrong_eps")
        user.prepare(model, "float32")
        a, b = ref.run(random_inputs), user.run(random_inputs)
    finally:
        unregister_backend("wrong_eps")
    verdicts = [(k, compare(a[k], b[k], check_dtype=False, **FP32_AGREEMENT).passed) for k in a]
    first_failure = next(k for k, ok in verdicts if not ok)
    assert first_failure == CheckpointKey("post_attention", 2)
    assert all(ok for k, ok in verdicts if k.layer is not None and k.layer < 2 or k.name == "post_embedding")


def test_explicit_module_to_checkpoint_map(tiny_qwen2, random_inputs):
    factory = module_backend(
        "mapped",
        lambda model, dtype, device: build_hf_model(model, dtype, device),
        checkpoint_map={"model.layers.1": "post_mlp:1", "lm_head": ("post_processing", None)},
    )
    model, ref, _ = _pair(tiny_qwen2["hf"])
    backend = factory()
    backend.prepare(model, "float32")
    got = backend.run(random_inputs)
    assert list(got) == [CheckpointKey("post_mlp", 1), CheckpointKey("post_processing")]
    want = ref.run(random_inputs, list(got))
    for key in got:
        assert compare(want[key], got[key], check_dtype=False, **FP32_AGREEMENT).passed


def test_user_backend_from_any_object(tiny_qwen2, random_inputs):
    """A user's own implementation (here the NumPy model computing in float32) plugged in as a backend."""
    from debug_framework.architectures import LlamaReference

    class MyEngine:
        def __init__(self, model, dtype, device):
            self.net = LlamaReference(model.config, model.weights, np.float32)

        def run(self, inputs, keys):
            out = self.net.forward(inputs.input_ids, inputs.attention_mask)
            return {f"{name}:{layer}" if layer is not None else name: t for (name, layer), t in out.items()}

    model, ref, _ = _pair(tiny_qwen2["hf"])
    eng = user_backend("my_engine", MyEngine, dtypes=("float32",))()
    eng.prepare(model, "float32")
    got = eng.run(random_inputs, ["post_mlp:3", "post_processing"])
    assert list(got) == [CheckpointKey("post_mlp", 3), CheckpointKey("post_processing")]
    want = ref.run(random_inputs)
    assert compare(want["post_processing"], got["post_processing"], check_dtype=False, **FP32_AGREEMENT).passed
    with pytest.raises(BackendInitializationError):
        eng.prepare(model, "bfloat16")


def test_registry_is_truthful_and_extensible():
    report = backend_availability()
    assert report["python_reference"] == (True, "") and report["pytorch"][0] is True
    assert detect_available_backends()["python_reference"] is True
    register_backend("needs_missing_runtime", "a_module_that_does_not_exist_xyz:Backend")
    register_backend("never", user_backend("never", lambda *a: None, availability=lambda: (False, "no device here")))
    try:
        report = backend_availability()
        assert report["needs_missing_runtime"][0] is False and "a_module_that_does_not_exist_xyz" in report["needs_missing_runtime"][1]
        assert report["never"] == (False, "no device here")
        with pytest.raises(BackendInitializationError) as info:
            get_backend("never")
        assert info.value.code == "DF002" and "no device here" in str(info.value) and "never" in str(info.value)
        with pytest.raises(BackendInitializationError):
            register_backend("never", user_backend("never", lambda *a: None))  # taken
    finally:
        unregister_backend("needs_missing_runtime")
        unregister_backend("never")
    with pytest.raises(BackendInitializationError) as info:
        get_backend("no_such_backend")
    assert "python_reference" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only report")
def test_pytorch_cuda_unavailable_says_why(tiny_qwen2):
    ok, reason = get_backend("pytorch", check=False, device="cuda").availability()
    assert not ok and "CUDA is not available" in reason
    backend = get_backend("pytorch", check=False)
    with pytest.raises(BackendInitializationError) as info:
        backend.prepare(load_model(tiny_qwen2["hf"]), "float32", "cuda")
    assert info.value.code == "DF002" and "pytorch" in str(info.value)


def test_inputs_save_and_replay(tmp_path, minilm_path):
    model = load_model(minilm_path)
    inputs = ModelInputs.from_text(model.tokenizer, ["The cat sat.", "A longer sentence about the cat."])
    assert inputs.attention_mask[0].sum() < inputs.attention_mask[1].sum()  # the short row is padded
    back = ModelInputs.load(inputs.save(tmp_path / "inputs.safetensors"))
    assert np.array_equal(back.input_ids, inputs.input_ids) and np.array_equal(back.attention_mask, inputs.attention_mask)
    assert back.meta["texts"] == ["The cat sat.", "A longer sentence about the cat."]
    r1 = ModelInputs.random(100, 3, 5, seed=4, pad_lengths=[0, 2])
    r2 = ModelInputs.random(100, 3, 5, seed=4, pad_lengths=[0, 2])
    assert np.array_equal(r1.input_ids, r2.input_ids) and r1.attention_mask[1].tolist() == [1, 1, 1, 0, 0]
    assert not np.array_equal(r1.input_ids, ModelInputs.random(100, 3, 5, seed=5).input_ids)


def test_out_of_vocabulary_ids_are_a_df005_error(tiny_qwen2):
    from debug_framework.errors import ValidationError

    _, ref, alt = _pair(tiny_qwen2["hf"])
    bad = ModelInputs.random(500, batch=1, length=4, seed=0)  # vocab is 128
    for backend in (ref, alt):
        with pytest.raises(ValidationError) as info:
            backend.run(bad)
        assert info.value.code == "DF005" and "[0, 128)" in str(info.value)


def test_weight_layout_reads_every_tensor_of_the_checkpoint(tiny_qwen2, tiny_llama_tied):
    """Each family's layout, declared once, names every tensor a checkpoint holds (none ignored)
    and the optional ones only as optional."""
    from debug_framework.architectures.llama import LAYOUT

    for path in (tiny_qwen2["hf"], tiny_llama_tied):
        model = load_model(path)
        names = set(LAYOUT.tensor_names(model.num_layers))
        assert set(model.weights) <= names
        optional = {n for n in names if n.endswith(".bias") or n == "lm_head.weight"}
        assert names - optional <= set(model.weights)


def test_missing_tensor_is_df004_naming_it(tiny_qwen2):
    from debug_framework.architectures import LlamaReference
    from debug_framework.errors import ModelLoadingError

    model = load_model(tiny_qwen2["hf"])
    weights = {k: model.weights[k] for k in model.weights if k != "model.layers.2.mlp.up_proj.weight"}
    with pytest.raises(ModelLoadingError) as e:
        LlamaReference(model.config, weights)
    assert "DF004" in str(e.value) and "model.layers.2.mlp.up_proj.weight" in str(e.value)


def test_float32_reference_computes_in_float32(tiny_qwen2, random_inputs):
    """Every checkpoint of the float32 reference is float32 (no float64 scalar widens the stream)
    and within float32 agreement of the float64 reference."""
    model = load_model(tiny_qwen2["hf"])
    f64, f32 = get_backend("python_reference"), get_backend("python_reference")
    f64.prepare(model, "float64")
    f32.prepare(model, "float32")
    a, b = f64.run(random_inputs), f32.run(random_inputs)
    for key in a:
        assert a[key].dtype == np.float64 and b[key].dtype == np.float32, key
        assert compare(a[key], b[key], check_dtype=False, **FP32_AGREEMENT).passed, key
