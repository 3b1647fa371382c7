"""The references written from the math decode exactly: a prefill then tokens one at a time over
their KV cache (``backends.decode.ReferenceDecoder``) give, in float64, what one forward pass over
the whole sequence gives at those tokens, and the cache holds that pass's rotated keys and values.
Left padding from an offset; sliding windows shorter than the sequence (Mistral, Gemma 3's local
layers); a mixture of experts."""

from __future__ import annotations

import numpy as np
import pytest

from debug_framework.architectures import build_reference
from debug_framework.backends.decode import ReferenceDecoder, decode_positions
from debug_framework.capture.keys import CheckpointKey
from debug_framework.modelio import load_model
from debug_framework.modelio.inputs import ModelInputs

STEPS, OFFSET = 4, 2


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3_text", "qwen3_moe"])
def test_decoding_equals_one_pass_over_the_whole_sequence(tiny, family):
    model = load_model(tiny(family))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (2, 6 + STEPS))
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # row 1 left-padded
    whole = ModelInputs(ids, mask, meta={"position_offset": OFFSET}).with_positions(OFFSET)
    prompt = ModelInputs(ids[:, :6], mask[:, :6], meta={"position_offset": OFFSET}).with_positions(OFFSET)
    keys = [CheckpointKey("post_attention", 1), CheckpointKey("post_mlp", 2), CheckpointKey("post_processing")]
    net = build_reference(model.config, model.weights, np.float64)

    once = ReferenceDecoder(net, lambda x: x)
    full = once.prefill(whole, keys)
    full_cache = once.kv_cache()

    decoder = ReferenceDecoder(net, lambda x: x)
    decoder.prefill(prompt, keys)
    for s in range(STEPS):
        positions = decode_positions(decoder.mask, OFFSET)[:, 0]
        assert (positions == whole.position_ids()[:, 6 + s]).all()
        got = decoder.decode_step(ids[:, 6 + s], positions, keys)
        for k in keys:
            np.testing.assert_allclose(got[str(k)][:, 0], full[str(k)][:, 6 + s], rtol=0, atol=1e-12)
    cache = decoder.kv_cache()
    valid = mask != 0
    for layer, (k, v) in full_cache.items():
        np.testing.assert_allclose(cache[layer][0][valid], k[valid], rtol=0, atol=1e-12)
        np.testing.assert_allclose(cache[layer][1][valid], v[valid], rtol=0, atol=1e-12)
    decoder.close()
    assert net.cache is None  # a replay after the decode keeps no cache


@pytest.mark.parametrize("backend_name", ["python_reference", "torch_reference", "pytorch"])
def test_a_layer_replayed_at_a_decode_step_reproduces_it(tiny, backend_name):
    """``run_decode_layer``: layer 1 at decode step 2 on its own input at that step (and the cache
    the prefill and step 1 wrote) gives that step's post_attention and post_mlp again."""
    from debug_framework.backends import get_backend
    from debug_framework.backends.torch_reference import TorchReferenceBackend

    backend = TorchReferenceBackend() if backend_name == "torch_reference" else get_backend(backend_name)
    backend.prepare(load_model(tiny("mistral")), "float64" if backend_name != "pytorch" else "float32")
    ids = np.random.default_rng(1).integers(0, 64, (2, 6))
    mask = np.ones_like(ids)
    mask[0, :2] = 0
    inputs = ModelInputs(ids, mask, meta={"position_offset": OFFSET}).with_positions(OFFSET)
    tokens = np.array([[3, 5, 7], [11, 13, 17]])
    run = backend.run_decode(inputs, 3, None, tokens)
    replay = backend.run_decode_layer(1, run.captures[2].tensors[CheckpointKey("post_mlp", 0)], inputs, 2, tokens)
    for key in (CheckpointKey("post_attention", 1), CheckpointKey("post_mlp", 1)):
        np.testing.assert_allclose(np.asarray(replay.tensors[key], np.float64),
                                   np.asarray(run.captures[2].tensors[key], np.float64), rtol=0,
                                   atol=1e-7 if backend_name == "pytorch" else 1e-12)
