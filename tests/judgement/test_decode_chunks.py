"""The float64 reference's greedy decode computes several steps a pass, a draft proposing the
tokens after the first (backends/_decode_draft.py): the same tokens, masks and cache spans as a step
a pass, every tensor within float64's last bits, whatever the draft proposes; a checkpoint that is
not ``[batch, tokens, ...]`` or a cache that is not plain falls back to a step a pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_framework.backends import get_backend
from debug_framework.backends.decode import CHUNK_STEPS
from debug_framework.backends.eager_reference import EagerReferenceBackend
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.capture.keys import all_checkpoints
from debug_framework.modelio.inputs import ModelInputs
from debug_framework.modelio.loader import load_model

STEPS = 2 * CHUNK_STEPS + 3


def _decode(model, inputs, draft):
    """Every pass of the reference's greedy decode, ``draft`` its ``_decode_draft`` (None: its own)."""
    backend = get_backend("float64_eager")
    backend.prepare(model, "float64", "cpu")
    if draft is not None:
        backend._decode_draft = draft
    keys = all_checkpoints(model.num_layers, model.router_layers)
    return list(backend.iter_decode(inputs, STEPS, keys, None, None))


def _same_decode(chunked, stepwise) -> None:
    assert [p.step for p in chunked] == [p.step for p in stepwise] == list(range(STEPS + 1))
    for a, b in zip(chunked, stepwise):
        assert (a.token is None) == (b.token is None)
        assert a.token is None or np.array_equal(a.token, b.token), a.step
        assert np.array_equal(a.mask, b.mask) and a.span == b.span, a.step
        assert set(a.capture.tensors) == set(b.capture.tensors) and set(a.kv) == set(b.kv)
        assert all(t.is_contiguous() for t in a.capture.tensors.values())  # each step's own memory
        pairs = [(a.capture[k], b.capture[k]) for k in b.capture.tensors]
        pairs += [(a.kv[i][j], b.kv[i][j]) for i in b.kv for j in (0, 1)]
        for x, y in pairs:
            assert x.shape == y.shape
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12 * float(y.abs().max()))


@pytest.fixture(scope="module")
def padded():
    """A tiny Llama's inputs, the second row left-padded."""
    def make(model):
        return ModelInputs.random(model.config.vocab_size, batch=2, length=6, seed=3, pad_lengths=[0, 2])
    return make


def test_a_greedy_float64_decode_computes_several_steps_a_pass_and_the_same_steps(tiny_models, padded):
    model = load_model(str(tiny_models("llama", 0)))
    inputs = padded(model)
    chunked = _decode(model, inputs, None)
    stepwise = _decode(model, inputs, lambda: None)
    _same_decode(chunked, stepwise)
    spans = {tuple(p.capture.meta["chunk"]) for p in chunked[1:]}
    assert all(n <= CHUNK_STEPS and 1 <= m <= n for _, m, n in spans)
    assert len(spans) < STEPS // 2  # most passes computed several steps (the draft is the model itself in float32)
    assert "chunk" not in stepwise[1].capture.meta


def test_a_draft_that_proposes_other_tokens_changes_nothing_but_the_passes(tiny_models, padded):
    """The draft another model (other weights): its proposals mostly refused, each refused step's
    cache positions dropped; the decode is still the reference's own, step for step."""
    model, other = load_model(str(tiny_models("llama", 0))), load_model(str(tiny_models("llama", 1)))
    inputs = padded(model)
    chunked = _decode(model, inputs, lambda: build_hf_model(other, torch.float32, "cpu").eval())
    _same_decode(chunked, _decode(model, inputs, lambda: None))
    chunks = [p.capture.meta.get("chunk") for p in chunked[1:]]
    refused = [c for c in chunks if c and c[1] < c[2]]
    assert refused  # some proposals refused: the crop path ran


def test_a_checkpoint_that_cannot_be_cut_per_step_falls_back_to_a_step_a_pass(tiny_models, padded):
    """A mixture of experts' router logits are ``[tokens, experts]``, not ``[batch, tokens, ...]``:
    the reference builds no draft for it; given one anyway, the pass over several tokens is dropped
    from the cache and the decode goes a step a pass, the same decode."""
    model = load_model(str(tiny_models("qwen3_moe", 0)))
    assert model.router_layers
    ref = EagerReferenceBackend()
    ref.prepare(model, "float64", "cpu")
    assert ref._decode_draft() is None
    inputs = padded(model)
    chunked = _decode(model, inputs, lambda: build_hf_model(model, torch.float32, "cpu").eval())
    assert all("chunk" not in p.capture.meta for p in chunked)
    _same_decode(chunked, _decode(model, inputs, lambda: None))


def test_a_sliding_window_cache_is_decoded_a_step_a_pass(tiny_models, padded):
    model = load_model(str(tiny_models("mistral", 0)))
    passes = _decode(model, padded(model), None)
    assert all("chunk" not in p.capture.meta for p in passes)


def test_only_the_float64_reference_builds_a_draft(tiny_models):
    model = load_model(str(tiny_models("llama", 0)))
    ref = EagerReferenceBackend()
    ref.prepare(model, "float64", "cpu")
    assert ref._decode_draft() is not None
    cal = EagerReferenceBackend()
    cal.prepare(model, "float32", "cpu")  # the calibration at the alternative's precision: its decode is judged as is
    assert cal._decode_draft() is None
    alt = get_backend("pytorch")
    alt.prepare(model, "float32", "cpu")
    assert alt._decode_draft() is None  # a backend under test decodes a step a pass


def test_a_session_records_the_references_passes_of_several_steps(tiny_models, engine):
    config = {"decode_steps": STEPS, "isolate": False, "precision_diagnosis": False, "input_shape": [2, 5]}
    result = engine.run(engine.create_session(tiny_models("llama"), config, "float64_eager", "pytorch"))
    chunks = result.decoded.info["reference_chunks"]
    assert result.passed and chunks["passes"] >= 2
    assert chunks["passes"] < chunks["steps"] <= chunks["computed"] <= STEPS + chunks["passes"] * CHUNK_STEPS


def test_the_draft_counts_new_memory_only_for_tensors_not_stored_in_float32(tiny_models, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from debug_framework.backends import eager_reference

    src = tiny_models("llama", 0)
    narrow = tmp_path / "bf16"
    shutil.copytree(src, narrow)
    for f in narrow.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(f).items()}, f, metadata={"format": "pt"})
    wide, bf16 = load_model(str(src)), load_model(str(narrow))
    assert eager_reference._draft_bytes(wide) == 0  # float32 tensors: the file's pages, mapped
    elements = sum(t.numel() for f in narrow.glob("*.safetensors") for t in load_file(f).values())
    assert eager_reference._draft_bytes(bf16) == 4 * elements
    monkeypatch.setattr(eager_reference, "DRAFT_BYTES", 4 * elements - 1)
    for model, built in ((wide, True), (bf16, False)):
        ref = EagerReferenceBackend()
        ref.prepare(model, "float64", "cpu")
        draft = ref._decode_draft()
        assert (draft is not None) is built
    name = "model.layers.0.mlp.down_proj.weight"  # the float32 draft's tensor is the shared mapping's: counted once
    assert draft_of(wide).get_parameter(name).data_ptr() == wide.weights.reading(name).data_ptr()


def draft_of(model):
    ref = EagerReferenceBackend()
    ref.prepare(model, "float64", "cpu")
    return ref._decode_draft()


@pytest.mark.parametrize("fails_at", [1, CHUNK_STEPS + 1])
def test_a_draft_that_fails_leaves_a_step_a_pass(tiny_models, padded, fails_at):
    """Its prefill (call 1) or its second proposal (a call after the first 7) raises: the decode goes
    on a step a pass from there."""
    model = load_model(str(tiny_models("llama", 0)))

    def failing():
        net = build_hf_model(model, torch.float32, "cpu").eval()
        calls = []

        def hook(*_):
            calls.append(1)
            if len(calls) == fails_at:
                raise RuntimeError("the draft broke")
        net.register_forward_pre_hook(hook)
        return net
    inputs = padded(model)
    passes = _decode(model, inputs, failing)
    _same_decode(passes, _decode(model, inputs, lambda: None))
    assert any("chunk" in p.capture.meta for p in passes) is (fails_at > 1)


def test_a_rotary_embedding_that_follows_the_length_gets_no_draft(tiny_models):
    """Dynamic NTK or LongRoPE frequencies change with a pass's longest position: a step a pass."""
    model = load_model(str(tiny_models("llama", 0)))
    ref = EagerReferenceBackend()
    ref.prepare(model, "float64", "cpu")
    rotary = next(m for m in ref.module.modules() if hasattr(m, "rope_type"))
    for kind, drafted in (("default", True), ("dynamic", False), ("longrope", False)):
        rotary.rope_type = kind
        assert (ref._decode_draft() is not None) is drafted, kind


@pytest.mark.parametrize("family,reference", [(f, "torch_reference") for f in (
    "llama", "qwen2", "mistral", "qwen3", "gemma2", "gemma3_text", "phi3", "qwen3_moe")] + [
    ("gemma3_text", "python_reference"), ("qwen3_moe", "python_reference")])
def test_a_reference_from_the_math_fed_several_tokens_a_pass_decodes_as_one_a_pass(tiny_models, family, reference):
    """A reference from the math (``torch_reference``, ``python_reference``) fed its tokens by a feed (``ReferenceDecoder.decode_steps``: several a
    pass over its cache, each attending over the tokens before it) gives every step's checkpoints,
    tokens, masks and K/V of a decode fed one token a pass (left padding, sliding windows past
    their width, a router's flattened logits)."""
    from debug_framework.backends.torch_reference import TorchReferenceBackend
    from debug_framework.services.validation.decode_calibration import ChosenTokens

    steps = CHUNK_STEPS + 5
    model = load_model(str(tiny_models(family, 0)))
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=5, seed=2, pad_lengths=[0, 2])
    # the calibration's reference from the math (the session's default), or the NumPy one
    backend = TorchReferenceBackend() if reference == "torch_reference" else get_backend(reference)
    backend.prepare(model, "float64", "cpu")
    keys = all_checkpoints(model.num_layers, model.router_layers)
    tokens = np.random.default_rng(3).integers(0, model.config.vocab_size, (2, steps))
    one = list(backend.iter_decode(inputs, steps, keys, tokens.copy(), None))
    feed = ChosenTokens(tokens.copy())
    feed.count = steps
    several = list(backend.iter_decode(inputs, steps, keys, feed, None))
    assert [p.step for p in several] == list(range(steps + 1))
    assert [p.capture.meta.get("chunk") for p in several[1:CHUNK_STEPS + 1]] == [[1, CHUNK_STEPS, CHUNK_STEPS]] * CHUNK_STEPS
    for a, b in zip(several, one):
        np.testing.assert_array_equal(a.mask, b.mask)
        assert a.span == b.span and set(a.capture.tensors) == set(b.capture.tensors)
        if b.token is not None:
            np.testing.assert_array_equal(a.token, b.token)
        for k, t in b.capture.tensors.items():
            assert tuple(a.capture[k].shape) == tuple(t.shape), (a.step, k)
            torch.testing.assert_close(torch.as_tensor(np.asarray(a.capture[k])), torch.as_tensor(np.asarray(t)),
                                       rtol=1e-9, atol=1e-9)
        held = torch.from_numpy(a.mask[:, :, None, None] != 0)
        for layer, (k, v) in b.kv.items():
            n = k.shape[1]
            for x, y in ((a.kv[layer][0], k), (a.kv[layer][1], v)):  # torch or NumPy, as the reference keeps them
                x, y = torch.as_tensor(np.asarray(x)), torch.as_tensor(np.asarray(y))
                torch.testing.assert_close(x * held[:, -n:], y * held[:, -n:], rtol=1e-9, atol=1e-9)
