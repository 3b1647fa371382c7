"""Isolation's replays resumed along one llama.cpp pass (backends/llamacpp/chain.py) give what a
pass of their own gives, in order, out of order and again, and end when released."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("xllamacpp")


def test_chained_replays_equal_their_own_passes(hf_llama: Path, tmp_path: Path) -> None:
    from debug_framework.backends.llamacpp.runner import LlamaCppBackend
    from debug_framework.backends.python_reference import PythonReferenceBackend
    from debug_framework.capture.keys import CheckpointKey
    from debug_framework.modelio import ModelInputs, load_model
    from debug_framework.backends.llamacpp.convert import write_gguf

    model = load_model(write_gguf(hf_llama, tmp_path / "m.gguf", tensor_type="q8_0"))
    inputs = ModelInputs.random(model.config.vocab_size, 2, 8, seed=1, pad_lengths=[0, 2])
    ref = PythonReferenceBackend()
    ref.prepare(model, "float64")
    captured = ref.run(inputs, capture_layer_inputs=True)
    alt = LlamaCppBackend()
    alt.prepare(model, "float32")

    def own_pass(i: int, block: str) -> dict[CheckpointKey, np.ndarray]:
        attn, out = CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)
        node = alt._input_node(i) if block == "layer" else alt._node(attn)
        given = captured.layer_inputs[i] if block == "layer" else captured.tensors[attn]
        keys = [attn, out] if block == "layer" else [out]
        kept, rows = alt._replayed(inputs, node, given, {alt._node(k) for k in keys}, f"l_out-{i}")
        return alt._capture(kept, rows, keys, 0.0).tensors

    order = [0, 1, 1, 0]  # in order (one pass), then again and out of order (new passes)
    for i in order:
        layer = alt.run_layer(i, captured.layer_inputs[i], inputs).tensors
        mlp = alt.run_block(i, "mlp", captured.tensors[CheckpointKey("post_attention", i)], inputs).tensors
        for got, want in ((layer, own_pass(i, "layer")), (mlp, own_pass(i, "mlp"))):
            assert set(got) == set(want)
            assert all(np.array_equal(got[k], want[k]) for k in want)
    threads = [chain._thread for chain in alt._chains.values()]
    assert threads and all(t is not None and t.is_alive() for t in threads)  # waiting at layer 1's input
    alt.release_replays()
    assert not alt._chains and not any(t.is_alive() for t in threads if t is not None)
