"""GGUF files as models: the metadata mapped to the typed config, weights dequantized with q/k rows
back in Hugging Face's order, and malformed files refused with DF004 before anything they claim is
allocated."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from debug_framework.errors import ModelLoadingError  # noqa: E402
from debug_framework.modelio import load_model  # noqa: E402
from debug_framework.modelio.gguf_read import read_gguf  # noqa: E402
from debug_framework.backends.llamacpp.convert import write_gguf  # noqa: E402


def _s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _raw(tensors: list[tuple[str, list[int], int, int]], data: bytes = b"", *, n_tensors: int | None = None,
         kv: dict[str, str] | None = None) -> bytes:
    """A GGUF v3 written byte by byte: string metadata, tensor infos ``(name, ne, type, offset)``, data."""
    kv = {"general.architecture": "llama", **(kv or {})}
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors, len(kv))
    for key, value in kv.items():
        out += _s(key) + struct.pack("<I", 8) + _s(value)
    for name, ne, kind, offset in tensors:
        out += _s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", kind, offset)
    out += b"\0" * (-len(out) % 32)
    return out + data


@pytest.fixture(scope="module")
def llama_q8(llama_gguf) -> Path:
    return llama_gguf("q8_0")


def test_a_gguf_loads_as_its_family_with_hf_weights(hf_llama: Path, llama_gguf) -> None:
    hf = load_model(hf_llama)
    model = load_model(llama_gguf("f32"))
    assert model.format == "gguf" and model.architecture == "llama"
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim) == (2, 2, 16)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight", "lm_head.weight"):
        np.testing.assert_array_equal(model.weights.numpy(name, np.float32), hf.weights.numpy(name, np.float32))


def test_quantized_weights_are_read_dequantized(hf_llama: Path, llama_q8: Path) -> None:
    hf = load_model(hf_llama).weights.numpy("model.layers.0.mlp.up_proj.weight")
    got = load_model(llama_q8).weights.numpy("model.layers.0.mlp.up_proj.weight")
    assert 0 < np.abs(got - hf).max() < 0.01 * np.abs(hf).max()
    assert read_gguf(llama_q8).tensor_types()["blk.0.ffn_up.weight"] == "Q8_0"


@pytest.mark.parametrize("what, make, message", [
    ("truncated", lambda f: f.read_bytes()[: len(f.read_bytes()) // 2], "past the end|truncated"),
    ("wrong magic", lambda f: b"GGML" + f.read_bytes()[4:], "wrong magic"),
    ("tensor count", lambda f: f.read_bytes()[:8] + struct.pack("<Q", 2**60) + f.read_bytes()[16:], "absurd tensor count"),
    ("metadata count", lambda f: f.read_bytes()[:16] + struct.pack("<Q", 2**62) + f.read_bytes()[24:],
     "absurd metadata count"),
])
def test_damaged_files_are_df004(llama_q8: Path, tmp_path: Path, what: str, make, message: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(make(llama_q8))
    with pytest.raises(ModelLoadingError, match=f"DF004.*({message})"):
        load_model(bad)


@pytest.mark.parametrize("tensors, data, message", [
    ([("w", [32, 2**40], 0, 0)], b"", "more than the .*-byte file can hold"),  # absurd shape
    ([("w", [32, 781_250_000], 0, 0)], b"", "more than the .*-byte file can hold"),  # a 100 GB claimed size
    ([("w", [32, 2], 0, 2**40)], b"\0" * 256, "past the end of the file"),  # offset past the end
    ([("w", [32, 2], 0, 0)], b"\0" * 64, "past the end of the file"),  # data cut short
    ([("w", [30, 2], 8, 0)], b"\0" * 256, "whole number of Q8_0 blocks"),
    ([("w", [32, 2, 1, 1, 1], 0, 0)], b"\0" * 256, "5 dimensions"),
    ([("w", [32, 2], 99, 0)], b"\0" * 256, "unknown GGML type 99"),
])
def test_absurd_headers_are_refused_before_any_allocation(tmp_path: Path, tensors, data: bytes, message: str) -> None:
    bad = tmp_path / "absurd.gguf"
    bad.write_bytes(_raw(tensors, data))
    with pytest.raises(ModelLoadingError, match=f"DF004.*{message}"):
        read_gguf(bad)


def test_an_architecture_without_a_reference_is_named(tmp_path: Path) -> None:
    f = tmp_path / "g.gguf"
    f.write_bytes(_raw([("token_embd.weight", [32, 4], 0, 0)], b"\0" * 512, kv={"general.architecture": "falcon"}))
    with pytest.raises(ModelLoadingError, match="DF004.*'falcon'"):
        load_model(f)


def test_phi3_fused_projections_read_back(hf_phi3: Path, tmp_path: Path) -> None:
    """Phi-3's qkv_proj / gate_up_proj are written as attn_qkv / ffn_up and read back under their names."""
    hf = hf_phi3
    model = load_model(write_gguf(hf, tmp_path / "phi3.gguf"))
    assert model.config.model_type == "phi3" and model.config.fused_projections
    name = "model.layers.1.mlp.gate_up_proj.weight"
    np.testing.assert_array_equal(model.weights.numpy(name, np.float32), load_model(hf).weights.numpy(name, np.float32))
