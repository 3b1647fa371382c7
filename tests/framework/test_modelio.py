"""Loading from every supported format, the content digest, and every DF004 bad-input case."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from debug_framework.errors import ModelLoadingError
from debug_framework.modelio import BertModelConfig, LlamaModelConfig, ModelInputs, load_model


def _copy_with_config(src_dir: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    shutil.copy(src_dir / "config.json", dst / "config.json")
    return dst


def test_hf_directory_typed_config_and_lazy_weights(tiny_qwen2):
    m = load_model(tiny_qwen2["hf"])
    assert m.format == "hf_dir" and m.architecture == "llama"
    c = m.config
    assert isinstance(c, LlamaModelConfig)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 16)
    assert c.qkv_bias and not c.o_bias and not c.tie_word_embeddings
    assert c.rope_scaling.rope_type == "llama3" and c.rope_scaling.factor == 8.0
    assert m.weights.shape("model.layers.0.self_attn.k_proj.weight") == (32, 64)
    assert m.weights["model.layers.0.self_attn.q_proj.bias"].shape == (64,)


def test_minilm_bert_config_and_tokenizer(minilm_path):
    m = load_model(minilm_path)
    assert isinstance(m.config, BertModelConfig) and m.config.hidden_act == "gelu"
    assert m.tokenizer is not None and m.num_layers == 6
    ids = ModelInputs.from_text(m.tokenizer, "hello world").input_ids
    assert ids[0, 0] == 101 and ids[0, -1] == 102  # [CLS] ... [SEP]


def test_all_formats_share_one_digest(tiny_qwen2, tmp_path):
    hf = tiny_qwen2["hf"]
    state = load_file(str(hf / "model.safetensors"))
    single = _copy_with_config(hf, tmp_path / "single") / "weights.safetensors"
    save_file(state, str(single))
    pt = _copy_with_config(hf, tmp_path / "pt") / "weights.pt"
    torch.save(state, str(pt))
    # sharded HF directory with an index
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(str(hf)).save_pretrained(str(sharded), max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    digests = {
        fmt: load_model(p).digest
        for fmt, p in {"hf": hf, "zt": tiny_qwen2["zt"], "single": single, "pt": pt, "sharded": sharded}.items()
    }
    assert len(set(digests.values())) == 1, digests
    assert load_model(tiny_qwen2["zt"]).format == "zt"
    # a changed weight changes the digest
    state["model.norm.weight"] = state["model.norm.weight"] + 1e-3
    changed = _copy_with_config(hf, tmp_path / "changed") / "weights.safetensors"
    save_file(state, str(changed))
    assert load_model(changed).digest != digests["hf"]


def test_digest_is_stable_across_processes(tiny_qwen2):
    code = "import sys; from debug_framework.modelio import load_model; print(load_model(sys.argv[1]).digest)"
    out = subprocess.run([sys.executable, "-c", code, str(tiny_qwen2["zt"])], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == load_model(tiny_qwen2["hf"]).digest


def test_a_digest_started_on_a_thread_is_the_same_and_its_error_is_raised_when_read(tiny_qwen2):
    expected = load_model(tiny_qwen2["hf"]).digest
    weights = load_model(tiny_qwen2["hf"]).weights
    weights.start_digest()
    assert weights.digest == expected
    broken = load_model(tiny_qwen2["hf"]).weights
    reader, stored = broken._loc["model.norm.weight"]
    broken._loc["model.norm.weight"] = (reader, "no such tensor")  # the thread's read fails
    broken.start_digest()
    with pytest.raises(ModelLoadingError, match="cannot read tensor"):
        broken.digest


def test_zt_tensors_are_zero_copy_views(tiny_qwen2):
    m = load_model(tiny_qwen2["zt"])
    a = m.weights["model.embed_tokens.weight"]
    b = m.weights["model.embed_tokens.weight"]
    assert a.data_ptr() == b.data_ptr()  # both views of the same mapped bytes, not copies


# ---------------------------------------------------------------- DF004: every bad input
def _df004(path, *fragments, tensor=None):
    with pytest.raises(ModelLoadingError) as info:
        load_model(path)
    err = info.value
    text = str(err)
    assert err.code == "DF004" and text.startswith("[DF004]")
    for frag in fragments:
        assert frag in text, text
    if tensor is not None:
        assert err.context.get("tensor") == tensor, err.context
    return err


def test_missing_path(tmp_path):
    err = _df004(tmp_path / "nope", "does not exist")
    assert str(tmp_path / "nope") in err.context["file"]


def test_unknown_format(tiny_qwen2, tmp_path):
    f = _copy_with_config(tiny_qwen2["hf"], tmp_path / "x") / "model.tflite"
    f.write_bytes(b"\x08\x07")
    _df004(f, "unknown weights format", "'.tflite'", "model.tflite")


def test_a_broken_onnx_file_is_df004_naming_it(tiny_qwen2, tmp_path):
    f = _copy_with_config(tiny_qwen2["hf"], tmp_path / "x") / "model.onnx"
    f.write_bytes(b"\x08\x07")  # an ONNX file is a model of its own (modelio.onnx_file), this one is empty
    _df004(f, "ONNX graph has no nodes", "model.onnx")


def test_truncated_safetensors(tiny_qwen2, tmp_path):
    src = (tiny_qwen2["hf"] / "model.safetensors").read_bytes()
    f = _copy_with_config(tiny_qwen2["hf"], tmp_path / "t") / "model.safetensors"
    f.write_bytes(src[: len(src) // 2])
    _df004(f, "truncated", "model.safetensors")


def test_corrupt_safetensors_header(tiny_qwen2, tmp_path):
    src = bytearray((tiny_qwen2["hf"] / "model.safetensors").read_bytes())
    src[9:40] = b"x" * 31  # garbage inside the JSON header
    f = _copy_with_config(tiny_qwen2["hf"], tmp_path / "c") / "model.safetensors"
    f.write_bytes(bytes(src))
    _df004(f, "corrupt", "model.safetensors")


def test_wrong_magic_zt_and_safetensors(tiny_qwen2, tmp_path):
    d = _copy_with_config(tiny_qwen2["hf"], tmp_path / "m")
    zt = d / "model.zt"
    shutil.copy(tiny_qwen2["hf"] / "model.safetensors", zt)  # a safetensors file named .zt
    _df004(zt, "wrong magic", "model.zt")
    st = d / "model.safetensors"
    shutil.copy(tiny_qwen2["zt"], st)  # a .zt file named .safetensors
    _df004(st, "wrong magic", "model.safetensors")
    pt = d / "w.bin"
    pt.write_bytes(b"GGUF" + b"\0" * 64)
    _df004(pt, "wrong magic", "w.bin")


def test_truncated_zt(tiny_qwen2, tmp_path):
    src = tiny_qwen2["zt"].read_bytes()
    f = _copy_with_config(tiny_qwen2["hf"], tmp_path / "tz") / "model.zt"
    f.write_bytes(src[: len(src) // 2])
    _df004(f, "truncated or corrupt", "model.zt")


def test_tensor_missing_is_named(tiny_qwen2, tmp_path):
    state = load_file(str(tiny_qwen2["hf"] / "model.safetensors"))
    del state["model.layers.2.self_attn.v_proj.bias"]
    f = _copy_with_config(tiny_qwen2["hf"], tmp_path / "miss") / "model.safetensors"
    save_file(state, str(f))
    _df004(f, "tensor missing", tensor="model.layers.2.self_attn.v_proj.bias")


def test_shape_contradicting_config(tiny_qwen2, tmp_path):
    d = _copy_with_config(tiny_qwen2["hf"], tmp_path / "shape")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 80  # the weights have 96
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(tiny_qwen2["hf"] / "model.safetensors", d / "model.safetensors")
    _df004(d, "contradicts the config", "[80, 64]", tensor="model.layers.0.mlp.gate_proj.weight")


def test_unsupported_architecture(tiny_qwen2, tmp_path):
    """Another family's config over these weights runs on the generic tier, whose transformers
    loader refuses the weights when the model is built (DF004 naming a tensor); an architecture
    transformers does not know is DF004 at once."""
    from debug_framework.backends.pytorch import build_hf_model

    d = _copy_with_config(tiny_qwen2["hf"], tmp_path / "arch")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(tiny_qwen2["hf"] / "model.safetensors", d / "model.safetensors")
    model = load_model(d)
    assert model.architecture == "generic" and model.config.model_class == "GPT2LMHeadModel"
    with pytest.raises(ModelLoadingError) as info:
        build_hf_model(model)
    assert info.value.code == "DF004" and "missing" in str(info.value) and info.value.context.get("tensor")
    cfg["model_type"] = "no_such_architecture"
    (d / "config.json").write_text(json.dumps(cfg))
    _df004(d, "no_such_architecture", "config.json")


def test_missing_config_and_empty_directory(tiny_qwen2, tmp_path):
    d = tmp_path / "noconf"
    d.mkdir()
    shutil.copy(tiny_qwen2["hf"] / "model.safetensors", d / "model.safetensors")
    _df004(d, "config.json not found")
    empty = tmp_path / "empty"
    empty.mkdir()
    _df004(empty, "no weights in the directory")


def test_pickle_with_code_is_refused(tiny_qwen2, tmp_path):
    d = _copy_with_config(tiny_qwen2["hf"], tmp_path / "pk")
    torch.save({"weights": torch.ones(2), "payload": Path("/etc")}, str(d / "w.pt"))  # not a plain state dict
    _df004(d / "w.pt", "nothing else is unpickled")


def test_a_cancelled_digest_leaves_no_thread(tiny_qwen2):
    weights = load_model(tiny_qwen2["hf"]).weights
    weights.start_digest()
    thread = weights._digesting
    weights.cancel_digest()
    assert not thread.is_alive()
    assert weights.digest == load_model(tiny_qwen2["hf"]).digest  # read later, it is computed then
