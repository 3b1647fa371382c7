"""K-quant GGUF files, written through ggml's own quantizer, judged at the precision llama.cpp
computes them at; and the trusted emulation's pieces checked against ggml and the ``gguf`` package
(Q8_K activations, the weights' round trips, llama-quantize's choice of types)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("xllamacpp")

from debug_framework.backends.llamacpp.convert import weight_type, write_gguf  # noqa: E402

from .conftest import make_hf, validate  # noqa: E402


@pytest.fixture(scope="module")
def hf_256(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with hidden and MLP sizes of 256 (one K-quant super-block per row); its output
    projection's rows (4 heads of 16) are 64 long, so they fall back to Q5_0 as llama-quantize's do."""
    return make_hf("llama", tmp_path_factory.mktemp("kquant") / "hf", seed=21, hidden_size=256,
                   intermediate_size=256)


@pytest.fixture(scope="module")
def kquant_files(hf_256: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("kquant_files")
    return {t: write_gguf(hf_256, out / f"{t}.gguf", tensor_type=t) for t in ("q4_k", "q4_k_m")}



def test_q8_k_activations_are_ggmls_quantize_row_q8_k() -> None:
    """The emulation's Q8_K equals what the CPU backend's own quantize_row_q8_K stores, bit for bit:
    all-zero, negative-max and exact-half blocks included."""
    import torch

    from debug_framework.backends.llamacpp.binding import ggml_quantize_row_q8_k, library
    from debug_framework.backends.llamacpp.precision import quantize_q8_k

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 512)) * rng.uniform(1e-3, 1e2, (16, 1))).astype(np.float32)
    x[0, :256] = 0.0
    x[1, 7] = -4 * np.abs(x[1, :256]).max()
    x[2, :256] = np.arange(256, dtype=np.float32) / 2  # max 127.5: x * 127 / max lands on halves
    ours = quantize_q8_k(torch.from_numpy(x)).numpy()
    theirs = ggml_quantize_row_q8_k(library(), x)
    assert np.array_equal(ours, theirs)
    assert not np.array_equal(ours, x)


def test_weight_round_trips_are_bit_exact() -> None:
    """The vectorised round trips equal the ``gguf`` package's quantize + dequantize (ggml's reference
    quantizers), ties and zero blocks included; a type without a quantizer is None."""
    import gguf

    from debug_framework.backends.llamacpp.precision import requantized

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 64)) * 0.05).astype(np.float32)
    x[0] = 0.0
    x[1, :32] = np.arange(-16, 16, dtype=np.float32) * 0.5
    for kind in ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        qtype = gguf.GGMLQuantizationType[kind]
        want = np.asarray(gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype), np.float32).reshape(x.shape)
        assert np.array_equal(requantized(x, kind), want), kind
    assert requantized(x, "IQ2_XXS") is None  # needs an importance matrix
    assert requantized(x, "Q4_K") is None  # rows of 64 are no K-quant super-block


def test_llama_quantize_types_of_a_q4_k_m_file() -> None:
    """llama-quantize's Q4_K_M on a dense 32-layer model: Q6_K head and tied embedding, Q6_K attn_v and
    ffn_down in its more-bits layers, Q5_K fused qkv; rows that are not whole blocks fall back."""
    more = [i for i in range(32) if weight_type(f"blk.{i}.attn_v.weight", 4096, "q4_k_m", 32, True) == "q6_k"]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert weight_type("blk.5.ffn_down.weight", 11008, "q4_k_m", 32, True) == "q4_k"  # 11008 = 43 x 256
    assert weight_type("blk.6.ffn_down.weight", 11008, "q4_k_m", 32, True) == "q6_k"
    assert weight_type("blk.5.attn_q.weight", 4096, "q4_k_m", 32, True) == "q4_k"
    assert weight_type("blk.5.attn_qkv.weight", 3072, "q4_k_m", 32, True) == "q5_k"
    assert weight_type("output.weight", 4096, "q4_k_m", 32, True) == "q6_k"
    assert weight_type("token_embd.weight", 4096, "q4_k_m", 32, True) == "q4_k"
    assert weight_type("token_embd.weight", 896, "q4_k_m", 24, False) == "q8_0"  # tied head, rows of 896
    assert weight_type("blk.0.attn_q.weight", 896, "q4_k_m", 24, False) == "q5_0"
    assert weight_type("blk.0.attn_q.weight", 896, "q6_k", 24, False) == "q8_0"
    assert weight_type("blk.0.attn_q.weight", 64, "q2_k", 2, True) == "iq4_nl"
    assert weight_type("blk.0.attn_q.weight", 20, "q4_k", 2, True) == "f16"


def test_a_k_quant_file_reads_back_as_ggml_quantized_it(hf_256: Path, kquant_files: dict[str, Path]) -> None:
    """The reader dequantizes the K-quants (q/k rows back in Hugging Face's order) to exactly what
    the emulation re-quantizes the Hugging Face weights to; the types are the ones chosen."""
    from debug_framework.backends.llamacpp.precision import requantized
    from debug_framework.modelio import load_model

    hf, mixed = load_model(hf_256), load_model(kquant_files["q4_k_m"])
    types = {"model.layers.1.self_attn.q_proj.weight": "Q4_K", "model.layers.1.self_attn.v_proj.weight": "Q6_K",
             "model.layers.0.self_attn.o_proj.weight": "Q5_0", "lm_head.weight": "Q6_K"}
    for name, kind in types.items():
        stored = mixed.weights.numpy(name, np.float32)
        assert np.array_equal(stored, requantized(hf.weights.numpy(name, np.float32), kind)), name


def test_k_quant_files_pass_at_auto_and_fail_at_float32_as_q4_k(engine, hf_256: Path,
                                                                kquant_files: dict[str, Path]) -> None:
    """A correct Q4_K conversion passes against the Hugging Face model (re-quantized through ggml) at
    --dtype auto; judged at float32 the Q4_K file fails, and the precision diagnosis names its
    quantization. (A Q4_K_M file against its own weights: the docs' example, tested below.)"""
    conversion = validate(engine, hf_256, alternative_options={"model_file": str(kquant_files["q4_k"])})
    assert conversion.passed, [c.to_dict() for c in conversion.results if not c.passed]
    strict = validate(engine, kquant_files["q4_k"], dtype="float32")
    assert not strict.passed and strict.consistent_with == "q4_k"


def test_ggml_quantizer_refuses_what_would_abort_it() -> None:
    from debug_framework.backends.llamacpp.binding import ggml_quantize_rows, library
    from debug_framework.errors import BackendInitializationError

    with pytest.raises(BackendInitializationError, match="DF002.*whole blocks of 256"):
        ggml_quantize_rows(library(), np.zeros((2, 100), np.float32), "Q4_K")
    with pytest.raises(BackendInitializationError, match="DF002.*IQ2_XXS"):
        ggml_quantize_rows(library(), np.zeros((2, 256), np.float32), "IQ2_XXS")


def test_the_k_quant_example_of_the_docs_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/gguf.md's K-quant example prints what it says."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gguf.md").read_text(encoding="utf-8")
    section = doc.split("## K-quant files", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    exec(compile(block, "docs/gguf.md (K-quant files)", "exec"), {})
    assert capsys.readouterr().out.strip().splitlines() == ["auto True None", "float32 False q4_k"]
