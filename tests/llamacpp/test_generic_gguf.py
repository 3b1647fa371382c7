"""GGUF files of architectures without a reference written from the math (GPT-2: learned positions,
LayerNorm, fused Conv1D qkv, GELU; StarCoder2: GQA, NeoX rotary, biases; StableLM: a parallel
attention+MLP block, partial rotary, SiLU-gated MLP; Phi-2: parallel, GELU, an LM head bias)
validated on the generic tier: read as the transformers model, run in llama.cpp, judged at the
precision llama.cpp runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import validate

pytest.importorskip("xllamacpp")

#: two layers, 4 heads of 16 (StarCoder2: 2 KV heads), rows of 64: two Q8_0 blocks
_GPT2 = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, n_inner=96)
_STARCODER2 = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0)
_STABLELM = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, use_parallel_residual=True,
                 partial_rotary_factor=0.5)
_PHI = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, partial_rotary_factor=0.5)
_CLASSES = {"phi": ("PhiConfig", "PhiForCausalLM", _PHI),"gpt2": ("GPT2Config", "GPT2LMHeadModel", _GPT2),
            "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", _STARCODER2),
            "stablelm": ("StableLmConfig", "StableLmForCausalLM", _STABLELM)}


def _save(kind: str, directory: Path) -> Path:
    import torch
    import transformers

    config, model, sizes = _CLASSES[kind]
    torch.manual_seed(0)
    getattr(transformers, model)(getattr(transformers, config)(**sizes)).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Per architecture: the Hugging Face directory, its f32 and q8_0 GGUFs, and a file with a
    converter bug (GPT-2: layer 1's fused qkv scaled; StarCoder2: layer 0's ffn_up; StableLM: layer 1's;
    Phi-2: layer 1's attn_k)."""
    from debug_framework.backends.llamacpp.convert import write_gguf

    out: dict[str, dict[str, Path]] = {}
    for kind, wrong in (("gpt2", "blk.1.attn_qkv.weight"), ("starcoder2", "blk.0.ffn_up.weight"),
                        ("stablelm", "blk.1.ffn_up.weight"), ("phi", "blk.1.attn_k.weight")):
        root = tmp_path_factory.mktemp(f"generic_{kind}")
        hf = _save(kind, root / "hf")
        out[kind] = {"hf": hf, "f32": write_gguf(hf, root / "f32.gguf"),
                     "q8_0": write_gguf(hf, root / "q8_0.gguf", tensor_type="q8_0"),
                     "bug": write_gguf(hf, root / "bug.gguf", tensor_type="f16",
                                       transform=lambda name, hf_, conv, w=wrong: conv * 1.5 if name == w else conv)}
    return out


@pytest.mark.parametrize("kind", ["gpt2", "starcoder2", "stablelm", "phi"])
def test_file_reads_as_the_transformers_model(files: dict[str, dict[str, Path]], kind: str) -> None:
    """The config is the generic tier's, built from the metadata; every tensor reads back under the
    transformers name as saved (GPT-2's Conv1D weights transposed back)."""
    from debug_framework.modelio.loader import load_model

    model, hf = load_model(files[kind]["f32"]), load_model(files[kind]["hf"])
    assert model.architecture == "generic" and model.format == "gguf"
    assert (model.config.model_type, model.num_layers, model.config.hidden_size) == (kind, 2, 64)
    for name in hf.weights:
        np.testing.assert_array_equal(model.weights.numpy(name, np.float32), hf.weights.numpy(name, np.float32))


@pytest.mark.parametrize("kind", ["gpt2", "starcoder2"])
def test_judged_at_the_precision_llamacpp_runs(engine, files: dict[str, dict[str, Path]], kind: str) -> None:
    """At --dtype auto an f32 and a q8_0 file pass against their own weights, and the q8_0 file as a
    conversion of the Hugging Face model; at float32 the q8_0 file fails consistent with q8_0."""
    f = files[kind]
    assert validate(engine, f["f32"]).passed
    assert validate(engine, f["q8_0"]).passed
    assert validate(engine, f["hf"], alternative_options={"model_file": str(f["q8_0"])}).passed
    at_float32 = validate(engine, f["q8_0"], dtype="float32")
    assert not at_float32.passed and at_float32.consistent_with == "q8_0"


def test_float32_cache_and_the_gelu_table(engine, files: dict[str, dict[str, Path]]) -> None:
    """An f32 file with an F32 cache and flash attention off: the embeddings and the first
    attention match a plain float32 run; the first MLP does not (ggml's tanh GELU goes through a
    float16 table), which the calibration at --dtype auto reproduces, so it passes there."""
    exact = {"cache_type_k": "f32", "cache_type_v": "f32", "flash_attn": "off"}
    plain = validate(engine, files["gpt2"]["f32"], dtype="float32", alternative_options=exact)
    verdicts = {str(r.key): r.judgement.passed for r in plain.results}
    assert verdicts["post_embedding"] and verdicts["post_attention:0"] and not verdicts["post_mlp:0"]
    assert validate(engine, files["gpt2"]["f32"], alternative_options=exact).passed


@pytest.mark.parametrize(("kind", "layer", "block"), [("gpt2", 1, "attention"), ("starcoder2", 0, "mlp")])
def test_a_converter_bug_fails_at_its_layer(engine, files: dict[str, dict[str, Path]], kind: str, layer: int,
                                            block: str) -> None:
    f = files[kind]
    result = validate(engine, f["hf"], isolate=True, alternative_options={"model_file": str(f["bug"])})
    assert not result.passed
    assert (result.error_source["layer"], result.error_source["block"]) == (layer, block)


def test_two_decode_steps_through_llamacpps_cache(engine, files: dict[str, dict[str, Path]]) -> None:
    """Two steps through llama.cpp's own KV cache pass, each layer's keys and values compared."""
    result = validate(engine, files["starcoder2"]["f32"], decode_steps=2)
    assert result.passed and result.decode["steps"] == 2
    rows = result.decode["kv_cache"]
    assert {(r["step"], r["layer"]) for r in rows} == {(s, i) for s in range(3) for i in range(2)}
    assert all(r["passed"] for r in rows)


@pytest.mark.parametrize(("kind", "dtype"), [("stablelm", "float32"), ("phi", "auto")])
def test_a_parallel_block_without_its_node(engine, files: dict[str, dict[str, Path]], kind: str, dtype: str) -> None:
    """StableLM's and Phi-2's parallel attention+MLP graphs name no attention output alone:
    post_attention is not compared, never failed. An f32 file with an F32 cache and flash attention
    off passes (StableLM's SiLU: a plain float32 run; Phi-2's GELU goes through ggml's table: at
    auto); a bug in layer 1 fails at layer 1."""
    f = files[kind]
    exact = validate(engine, f["f32"], dtype=dtype,
                     alternative_options={"cache_type_k": "f32", "cache_type_v": "f32", "flash_attn": "off"})
    assert exact.passed
    assert [str(r.key) for r in exact.results] == ["post_embedding", "post_mlp:0", "post_mlp:1", "post_processing"]
    assert validate(engine, f["q8_0"]).passed
    bug = validate(engine, f["hf"], isolate=True, alternative_options={"model_file": str(f["bug"])})
    assert not bug.passed and bug.error_source["layer"] == 1


def test_metadata_that_builds_no_model_is_df004(files: dict[str, dict[str, Path]]) -> None:
    """Heads that do not divide the width, a rotated share wider than a head, per-head q/k norms the
    reading does not map: DF004 before any model is built (never a ZeroDivisionError)."""
    import dataclasses

    from debug_framework.errors import ModelLoadingError
    from debug_framework.modelio.gguf_generic import generic_gguf_config
    from debug_framework.modelio.gguf_read import read_gguf

    f = read_gguf(files["gpt2"]["f32"])
    arch = f.architecture
    for change, message in ((({f"{arch}.attention.head_count": 1000}), "not whole heads"),
                            (({f"{arch}.attention.head_count": 0}), "positive integer"),
                            (({f"{arch}.rope.dimension_count": 10**6}), "larger than a head")):
        bad = dataclasses.replace(f, metadata={**f.metadata, **change})
        with pytest.raises(ModelLoadingError, match=f"DF004.*{message}"):
            generic_gguf_config(bad)
    normed = dataclasses.replace(f, tensors={**f.tensors, "blk.0.attn_q_norm.weight": f.tensors["token_embd.weight"]})
    with pytest.raises(ModelLoadingError, match="DF004.*query/key norms"):
        generic_gguf_config(normed)


def test_a_truncated_file_is_still_df004(files: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    from debug_framework.errors import ModelLoadingError
    from debug_framework.modelio.loader import load_model

    data = files["gpt2"]["f32"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadingError, match="DF004.*past the end"):
        load_model(cut)


def test_the_docs_commands_exit_zero(files: dict[str, dict[str, Path]], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/gguf.md's generic-tier commands, run in this process on the tiny GPT-2 under the names
    they use, pass (exit 0)."""
    import re
    import shutil

    from debug_framework.cli.debug_validate import run

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gguf.md").read_text(encoding="utf-8")
    section = doc[doc.index("## The generic tier"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None
    shutil.copytree(files["gpt2"]["hf"], tmp_path / "gpt2-hf")
    shutil.copy(files["gpt2"]["q8_0"], tmp_path / "gpt2-q8_0.gguf")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "db.sqlite"))
    codes = [run(line.split()[1:]) for line in block.group(1).strip().splitlines()]
    assert codes == [0, 0], capsys.readouterr().out[-2000:]


def test_what_the_emulation_cannot_reproduce_is_said(files: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    """A model whose attention bypasses transformers' attention registry (BLOOM) cannot have its keys
    and values rounded to the KV cache type: said in words (the engine's versions carry it as
    ``not_reproduced``); GPT-2 (every product a module, attention through the registry) has nothing to say."""
    import torch
    import transformers

    from debug_framework.backends.llamacpp.generic_precision import (GenericLlamaPrecision, emulation_limits,
                                                                     generic_gguf_names)
    from debug_framework.modelio.generic import build_skeleton
    from debug_framework.modelio.loader import load_model

    torch.manual_seed(0)
    transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4)) \
        .save_pretrained(str(tmp_path / "bloom"))
    said = {}
    for directory, arch in ((tmp_path / "bloom", "bloom"), (files["gpt2"]["hf"], "gpt2")):
        model = load_model(directory)
        names = generic_gguf_names(model, arch)
        types = {g: "F32" if "norm" in g or g.endswith(".bias") else "Q8_0" for g in names.values()}
        precision = GenericLlamaPrecision("q8_0", types, "f16", "f16", "auto", architecture=arch)
        said[arch] = emulation_limits(build_skeleton(model.raw_config, meta=True), names, precision)
    assert said["gpt2"] == []
    assert len(said["bloom"]) == 1
    assert "BloomAttention does not call transformers' attention registry" in said["bloom"][0]
