"""The GGUF writer: llama.cpp's names, architecture keys and q/k permutation, every tensor type,
the transform hook, and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from debug_framework.errors import ModelLoadingError  # noqa: E402
from debug_framework.backends.llamacpp.convert import permute_for_rope, write_gguf  # noqa: E402


def _read(path: Path) -> tuple[dict[str, object], dict[str, tuple[str, np.ndarray]]]:
    """(metadata key -> value, tensor name -> (type name, float32 array shaped as HF shapes it))."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.tokens") or not field.types:
            continue
        fields[key] = field.contents()
    tensors = {}
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = (t.tensor_type.name, np.asarray(data, dtype=np.float32).reshape(tuple(reversed(t.shape))))
    return fields, tensors


def _hf_numpy(model_dir: Path, name: str) -> np.ndarray:
    from safetensors.numpy import load_file

    return load_file(str(model_dir / "model.safetensors"))[name].astype(np.float32)


@pytest.fixture(scope="module")
def llama_f32(llama_gguf) -> Path:
    return llama_gguf("f32")


def test_architecture_keys_and_names(llama_f32: Path) -> None:
    fields, tensors = _read(llama_f32)
    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == 2
    assert fields["llama.attention.head_count"] == 4 and fields["llama.attention.head_count_kv"] == 2
    assert fields["llama.rope.dimension_count"] == 16 and fields["llama.embedding_length"] == 64
    assert fields["tokenizer.ggml.model"] == "llama"
    assert {"token_embd.weight", "output_norm.weight", "output.weight", "blk.1.attn_q.weight",
            "blk.1.ffn_down.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"} <= set(tensors)
    assert all(kind == "F32" for kind, _ in tensors.values())


def test_llama_q_k_permuted_as_the_converter_does(hf_llama: Path, llama_f32: Path) -> None:
    _, tensors = _read(llama_f32)
    q, k = _hf_numpy(hf_llama, "model.layers.0.self_attn.q_proj.weight"), _hf_numpy(
        hf_llama, "model.layers.0.self_attn.k_proj.weight")
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"][1], permute_for_rope(q, 4, 4))
    np.testing.assert_array_equal(tensors["blk.0.attn_k.weight"][1], permute_for_rope(k, 4, 2))
    assert not np.array_equal(permute_for_rope(q, 4, 4), q)
    # rows of one head: [x0 .. x7 | y0 .. y7] -> [x0 y0 x1 y1 ...]
    np.testing.assert_array_equal(permute_for_rope(np.arange(16.0)[:, None], 1)[:4, 0], [0, 8, 1, 9])


def test_qwen_not_permuted(hf_qwen2: Path, tmp_path: Path) -> None:
    fields, tensors = _read(write_gguf(hf_qwen2, tmp_path / "q.gguf"))
    assert fields["general.architecture"] == "qwen2"
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"][1],
                                  _hf_numpy(hf_qwen2, "model.layers.0.self_attn.q_proj.weight"))
    assert "blk.0.attn_q.bias" in tensors


@pytest.mark.parametrize("tensor_type, ggml, tol", [("f16", "F16", 1e-3), ("q8_0", "Q8_0", 1e-2), ("q4_0", "Q4_0", 0.2)])
def test_tensor_types(llama_gguf, llama_f32: Path, tensor_type: str, ggml: str, tol: float) -> None:
    _, exact = _read(llama_f32)
    _, tensors = _read(llama_gguf(tensor_type))
    kind, w = tensors["blk.1.ffn_up.weight"]
    assert kind == ggml and tensors["blk.1.ffn_norm.weight"][0] == "F32"
    ref = exact["blk.1.ffn_up.weight"][1]
    err = np.abs(w - ref).max() / np.abs(ref).max()
    assert 0 < err < tol


def test_transform_hook_sees_original_and_converted(hf_llama: Path, tmp_path: Path) -> None:
    seen: list[str] = []

    def skip_permutation(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
        seen.append(name)
        return original if name.endswith(("attn_q.weight", "attn_k.weight")) else converted

    _, tensors = _read(write_gguf(hf_llama, tmp_path / "bug.gguf", transform=skip_permutation))
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"][1],
                                  _hf_numpy(hf_llama, "model.layers.0.self_attn.q_proj.weight"))
    assert "blk.1.ffn_gate.weight" in seen and len(seen) == len(tensors)


def test_refusals(hf_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadingError, match="DF004.*q3_x"):
        write_gguf(hf_llama, tmp_path / "x.gguf", tensor_type="q3_x")
    with pytest.raises(ModelLoadingError, match="DF004"):
        write_gguf(tmp_path / "missing", tmp_path / "x.gguf")
