"""Gemma 2, Gemma 3 and Phi-3 through llama.cpp: a correct conversion passes at ``--dtype auto``, a
converter bug fails at its layer and block (one tiny model and two files per family, once per module)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from debug_framework.backends.llamacpp.convert import write_gguf

from .conftest import validate

pytest.importorskip("xllamacpp")

#: family -> (the tensor the bug writes wrong, how, the layer and block it shows at, the drill-down's
#: culprit: the first llama.cpp node compared that is beyond its bound)
BUGS: dict[str, tuple[str, str, int, str, str]] = {
    "gemma2": ("blk.1.post_attention_norm.weight", "the norm written as w, not 1 + w", 1, "attention", "sa_out-1"),
    "gemma3": ("blk.0.attn_k_norm.weight", "the key norm written as w, not 1 + w", 0, "attention", "Kcur-0"),
    "phi3": ("blk.1.ffn_up.weight", "gate and up halves swapped", 1, "mlp", "ffn_swiglu-1"),
}


def _bug(tensor: str):
    def transform(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
        if name != tensor:
            return converted
        if name.endswith("ffn_up.weight"):  # the fused [gate; up] rows, halves swapped
            half = converted.shape[0] // 2
            return np.concatenate([converted[half:], converted[:half]])
        return original  # the +1 offset forgotten
    return transform


@pytest.fixture(scope="module", params=sorted(BUGS))
def family(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path, Path]:
    """(family, its Hugging Face directory, the correct GGUF, the GGUF with the family's bug)."""
    name = request.param
    hf = request.getfixturevalue({"gemma2": "hf_gemma2", "gemma3": "hf_gemma3", "phi3": "hf_phi3"}[name])
    out = tmp_path_factory.mktemp(f"families_{name}")
    good = write_gguf(hf, out / "good.gguf", tensor_type="q8_0")
    bad = write_gguf(hf, out / "bug.gguf", transform=_bug(BUGS[name][0]))
    return name, hf, good, bad



def test_a_correct_q8_0_file_passes_at_dtype_auto(engine, family) -> None:
    _, _, good, _ = family
    result = validate(engine, good)
    assert result.passed, [c.to_dict() for c in result.results if not c.passed]
    assert {c.to_dict()["id"] for c in result.results} >= {"post_attention:0", "post_attention:1", "post_mlp:1"}


def test_a_converter_bug_fails_at_its_layer_block_and_node(engine, family) -> None:
    name, hf, _, bad = family
    _, _, layer, block, node = BUGS[name]
    result = validate(engine, hf, alternative_options={"model_file": str(bad)}, isolate=True, drill_down=True)
    assert not result.passed and result.source is not None
    assert (result.source.kind, result.source.layer, result.source.block) == ("layer", layer, block)
    drilled = {d.layer: d for d in result.drilldown or []}
    assert drilled[layer].method == "ggml" and drilled[layer].culprit is not None
    assert drilled[layer].culprit.node == node


def test_the_file_reads_back_as_the_model(family) -> None:
    """The reader undoes the converter: config (soft-caps, window, layer types, rope bases) and
    weights (Gemma's norms less one, Phi-3's fused projections) as Hugging Face has them."""
    from debug_framework.modelio import load_model

    _, hf, _, _ = family
    original, read = load_model(hf), load_model(family[3].with_name("good.gguf"))
    for field in ("layer_types", "sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
                  "local_rope_theta", "rope_theta", "query_pre_attn_scalar", "hidden_act", "tie_word_embeddings"):
        assert getattr(read.config, field, None) == getattr(original.config, field, None), field
    exact = load_model(write_gguf(hf, family[3].with_name("f32.gguf")))
    assert sorted(exact.weights) == sorted(original.weights)
    for name in original.weights:
        want = original.weights.numpy(name, np.float32)
        np.testing.assert_allclose(exact.weights.numpy(name, np.float32), want, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_decoded_through_llamas_cache(engine, family, side: str) -> None:
    """Decode steps of two rows, the second padded (6 tokens of 8). Right-padded, its new tokens sit
    after the padding columns, and Gemma's window of 4 then reaches back past them: llama.cpp runs
    each row as its own sequence and counts the window in the row's tokens; so does the reference, as
    the engine declares (``window_counts``). Left-padded, both counts agree. Every step's checkpoints
    and the keys and values llama.cpp writes, every pass and layer, pass (Phi-3's keys and values:
    views of its fused projection, read along their strides)."""
    result = validate(engine, family[2], decode_steps=2, padding_side=side)
    assert result.passed, [c.to_dict()["id"] for c in result.results if not c.passed]
    kv = result.decoded.kv_cache
    assert all(row.k.passed and row.v.passed for row in kv)
    assert {(row.step, row.layer) for row in kv} == {(s, i) for s in range(3) for i in range(2)}


def test_a_window_written_wrong_fails_at_its_layer(engine, hf_gemma2: Path, tmp_path: Path) -> None:
    """A converter that writes Gemma 2's sliding window as 3 instead of 4: the conversion check
    fails at layer 0 (the sliding one), in its attention block, whatever the window counts."""
    import json
    import shutil

    hf = Path(shutil.copytree(hf_gemma2, tmp_path / "hf"))
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "sliding_window": 3}))
    bad = write_gguf(hf, tmp_path / "window-3.gguf")
    result = validate(engine, hf_gemma2, alternative_options={"model_file": str(bad)}, isolate=True)
    assert not result.passed and result.source is not None
    assert (result.source.kind, result.source.layer, result.source.block) == ("layer", 0, "attention")


def test_a_window_counts_cache_columns_or_a_rows_tokens() -> None:
    """A right-padded prompt of 3 tokens, 2 padding columns, then a decoded token (column 5), a
    window of 2: counted in columns the new token sees only itself (column 4 is padding); counted in
    the row's tokens it sees the prompt's last token too. A left-padded row counts alike either way."""
    from debug_framework.architectures.decoder import sliding_window_mask

    right, left = np.array([[1, 1, 1, 0, 0, 1]]), np.array([[0, 0, 1, 1, 1, 1]])
    assert sliding_window_mask(right, 2)[0, 0, 5].tolist() == [False] * 5 + [True]
    assert sliding_window_mask(right, 2, "tokens")[0, 0, 5].tolist() == [False, False, True, False, False, True]
    np.testing.assert_array_equal(sliding_window_mask(left, 2), sliding_window_mask(left, 2, "tokens"))


def test_what_llamas_gemma_does_not_read_is_not_written(hf_gemma2: Path, tmp_path: Path) -> None:
    """A query_pre_attn_scalar other than head_dim would be a file that computes another model: DF004."""
    import json
    import shutil

    from debug_framework.errors import ModelLoadingError

    hf = Path(shutil.copytree(hf_gemma2, tmp_path / "hf"))
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "query_pre_attn_scalar": 256}))
    with pytest.raises(ModelLoadingError, match="DF004.*query_pre_attn_scalar 256"):
        write_gguf(hf, tmp_path / "m.gguf")


def test_phi3s_cache_is_read_from_its_fused_projection(engine, hf_phi3: Path, tmp_path: Path) -> None:
    """Phi-3's keys and values are views of its fused q/k/v projection, read along their strides: a
    file whose layer-0 value rows are scaled fails the cache's values at layer 0, its keys pass."""
    def values_scaled(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
        if name != "blk.0.attn_qkv.weight":
            return converted
        v = converted.copy()
        v[-32:] *= 1.5  # the last kv_heads * head_dim rows: the values'
        return v

    bad = write_gguf(hf_phi3, tmp_path / "values.gguf", transform=values_scaled)
    result = validate(engine, hf_phi3, alternative_options={"model_file": str(bad)}, input_shape=[1, 8],
                       decode_steps=1)
    rows = {(row.step, row.layer): row for row in result.decoded.kv_cache}
    assert rows[(0, 0)].k.passed and not rows[(0, 0)].v.passed


def test_a_decode_only_difference_is_drilled_at_its_step(engine, hf_gemma2: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    """An engine that declared its window as counted in cache columns while llama.cpp counts tokens:
    the reference then differs from llama.cpp only at the right-padded row's decode steps, in the
    sliding layer 0, confirmed by replaying that layer alone at the step. The drill-down runs it at
    the step in llama.cpp, the reference and the calibration, each through its own KV cache, and
    names the attention node (``kqv_out-0``)."""
    from debug_framework.backends.llamacpp.runner import LlamaCppBackend

    monkeypatch.setattr(LlamaCppBackend, "window_counts", "columns")
    result = validate(engine, write_gguf(hf_gemma2, tmp_path / "f16.gguf", tensor_type="f16"), decode_steps=2,
                       drill_down=True, isolate=True)
    assert not result.passed and result.source is not None
    assert (result.source.kind, result.source.layer, result.source.step) == ("decode", 0, 1)
    assert result.source.confirmed, result.source.detail  # layer 0 replayed alone at step 1 in llama.cpp
    drilled = {(d.layer, d.step): d for d in result.drilldown or []}
    assert drilled[(0, 1)].method == "ggml" and drilled[(0, 1)].culprit is not None, drilled
    assert drilled[(0, 1)].culprit.node == "kqv_out-0"
