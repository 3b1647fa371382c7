"""Model loading refuses every malformed model with DF004 naming what and where, and nothing half-loads.

One test per reproduction of issue 16's "Model loading" section: bad optional config fields, JSON
bombs, shard-index garbage, exotic state dicts, unbounded sizes, non-regular files, impossible
contents, and configs the reference would read differently from transformers.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from debug_framework.errors import ModelLoadingError
from debug_framework.modelio import load_model, parse_config

from ._tiny_files import BERT_CONFIG, LLAMA_CONFIG, tiny_state, write_config, write_model


def _df004(path: Path, *fragments: str, tensor: str | None = None) -> ModelLoadingError:
    with pytest.raises(ModelLoadingError) as info:
        load_model(path)
    err = info.value
    text = str(err)
    assert err.code == "DF004" and text.startswith("[DF004]"), text
    for frag in fragments:
        assert frag in text, text
    if tensor is not None:
        assert err.context.get("tensor") == tensor, err.context
    return err


def _with_config(tmp_path: Path, base: dict[str, Any], **changes: Any) -> Path:
    """The tiny model of ``base`` (weights unchanged) whose config.json has ``changes`` applied."""
    path = write_model(tmp_path / "m", base)
    cfg = {**base, **changes}
    write_config(tmp_path / "m", cfg)
    return path


# ------------------------------------------------------------------ optional config fields
BAD_OPTIONAL = [
    (LLAMA_CONFIG, "num_key_value_heads", "x"),
    (LLAMA_CONFIG, "head_dim", "x"),
    (LLAMA_CONFIG, "rms_norm_eps", "x"),
    (LLAMA_CONFIG, "rms_norm_eps", [1]),
    (LLAMA_CONFIG, "max_position_embeddings", "abc"),
    (LLAMA_CONFIG, "rope_scaling", "x"),
    (LLAMA_CONFIG, "rope_scaling", [1, 2]),
    (LLAMA_CONFIG, "rope_parameters", "x"),
    (LLAMA_CONFIG, "rope_theta", "x"),
    (LLAMA_CONFIG, "tie_word_embeddings", "false"),
    (LLAMA_CONFIG, "attention_bias", "no"),
    (LLAMA_CONFIG, "pad_token_id", "x"),
    (BERT_CONFIG, "type_vocab_size", "x"),
    (BERT_CONFIG, "layer_norm_eps", "x"),
    (BERT_CONFIG, "pad_token_id", "x"),
    (BERT_CONFIG, "max_position_embeddings", [3]),
]


@pytest.mark.parametrize(("base", "key", "value"), BAD_OPTIONAL, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_optional_config_field_is_df004(tmp_path, base, key, value):
    path = _with_config(tmp_path, base, **{key: value})
    err = _df004(path, repr(key), "config.json")
    assert err.context["file"].endswith("config.json")


@pytest.mark.parametrize("key", ["rope_type", "factor", "rope_theta"])
def test_bad_rope_parameter_values_are_df004(tmp_path, key):
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, key: {"nested": 1}}
    _df004(_with_config(tmp_path, LLAMA_CONFIG, rope_parameters=rope), "config.json")


# ------------------------------------------------------------------ JSON bombs
def test_config_nested_100000_deep_is_df004(tmp_path):
    path = write_model(tmp_path / "m")
    cfg = json.dumps(LLAMA_CONFIG)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    write_config(tmp_path / "m", cfg)
    _df004(path, "config.json", "nested")


def test_config_nested_deep_but_parseable_is_df004(tmp_path):
    # deep enough to trip later recursive consumers (json_safe, transformers), shallow enough to parse
    path = write_model(tmp_path / "m")
    write_config(tmp_path / "m", json.dumps({**LLAMA_CONFIG, "x": json.loads("[" * 72 + "]" * 72)}))
    _df004(path, "config.json", "nested")


def test_config_5000_digit_integer_is_df004(tmp_path):
    path = write_model(tmp_path / "m")
    write_config(tmp_path / "m", json.dumps(LLAMA_CONFIG)[:-1] + ', "vocab_size": ' + "9" * 5000 + "}")
    _df004(path, "config.json")


def test_float_field_given_a_huge_integer_is_df004(tmp_path):
    _df004(_with_config(tmp_path, LLAMA_CONFIG, rms_norm_eps=10**400), "'rms_norm_eps'")


# ------------------------------------------------------------------ shard index garbage
@pytest.mark.parametrize("weight_map", [["a", "b"], "model.safetensors", None, 3, {"a": 1}])
def test_index_weight_map_of_wrong_type_is_df004(tmp_path, weight_map):
    d = write_model(tmp_path / "m", fmt="sharded")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _df004(d, "model.safetensors.index.json", "weight_map")


def test_index_naming_a_file_outside_the_directory_is_df004(tmp_path):
    d = write_model(tmp_path / "m", fmt="sharded")
    outside = tmp_path / "outside.safetensors"
    save_file({"x": torch.ones(2)}, str(outside))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../outside.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    _df004(d, "model.safetensors.index.json", "../outside.safetensors")


def test_index_placing_a_tensor_in_the_wrong_shard_is_df004(tmp_path):
    d = write_model(tmp_path / "m", fmt="sharded")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    shards = sorted(set(wm.values()))
    name = next(n for n, s in wm.items() if s == shards[0])
    wm[name] = shards[1]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    _df004(d, "index", shards[1], tensor=name)


def test_a_tensor_in_two_files_is_df004(tmp_path):
    d = tmp_path / "m"
    write_model(d)
    save_file({"model.norm.weight": torch.zeros(16)}, str(d / "extra.safetensors"))
    (d / "model.safetensors").rename(d / "a.safetensors")
    _df004(d, "more than one file", tensor="model.norm.weight")


# ------------------------------------------------------------------ exotic state dicts
def test_bin_with_integer_keys_is_df004(tmp_path):
    state = tiny_state(LLAMA_CONFIG)
    state[7] = torch.ones(2)  # type: ignore[index]
    _df004(write_model(tmp_path / "m", fmt="bin", state=state), "not a string", "pytorch_model.bin")


def test_bin_with_sparse_tensor_is_df004(tmp_path):
    state = tiny_state(LLAMA_CONFIG)
    state["model.norm.weight"] = state["model.norm.weight"].to_sparse()
    _df004(write_model(tmp_path / "m", fmt="bin", state=state), "sparse", "pytorch_model.bin",
           tensor="model.norm.weight")


# ------------------------------------------------------------------ unbounded sizes, special files
def test_a_billion_layers_is_refused_fast(tmp_path):
    path = _with_config(tmp_path, LLAMA_CONFIG, num_hidden_layers=1_000_000_000)
    start = time.perf_counter()
    _df004(path, "num_hidden_layers", "1000000000")
    assert time.perf_counter() - start < 2.0


def test_more_layers_than_the_weights_hold_is_refused_before_any_name_is_built(tmp_path):
    path = _with_config(tmp_path, LLAMA_CONFIG, num_hidden_layers=65536)
    start = time.perf_counter()
    _df004(path, "num_hidden_layers=65536 is more than the weights can hold")
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                 "head_dim"])
def test_sizes_beyond_what_the_weights_hold_are_refused_fast(tmp_path, key):
    path = _with_config(tmp_path, LLAMA_CONFIG, **{key: 2**20})
    start = time.perf_counter()
    _df004(path, key, "larger than any dimension of the weights")
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("key", ["max_position_embeddings", "type_vocab_size", "vocab_size"])
def test_bert_sizes_beyond_the_weights_are_refused(tmp_path, key):
    _df004(_with_config(tmp_path, BERT_CONFIG, **{key: 10**6}), key, "larger than any dimension")


def test_sizes_beyond_any_model_are_refused_by_the_config_alone():
    with pytest.raises(ModelLoadingError, match="'hidden_size' must be between 1 and"):
        parse_config({**LLAMA_CONFIG, "hidden_size": 10**15})
    with pytest.raises(ModelLoadingError, match="'num_hidden_layers' must be between 1 and"):
        parse_config({**LLAMA_CONFIG, "num_hidden_layers": 10**9})


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "model.safetensors.index.json", "x.bin"])
def test_a_fifo_never_blocks(tmp_path, name):
    d = tmp_path / "m"
    write_model(d)
    if name == "model.safetensors":
        (d / name).unlink()
    elif name == "x.bin":
        (d / "model.safetensors").unlink()
    elif name == "config.json":
        (d / name).unlink()
    os.mkfifo(d / name)
    err = _df004(d, "not a regular file")
    assert name in err.context["file"]
    if name == "model.safetensors":
        _df004(d / name, "not a regular file")


# ------------------------------------------------------------------ impossible contents
def _retype_header(path: Path, old: bytes, new: bytes) -> None:
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = bytes(raw[8:8 + n])
    assert old in header
    raw[8:8 + n] = header.replace(old, new, 1)
    path.write_bytes(bytes(raw))


def test_header_edited_f32_to_i32_is_df004(tmp_path):
    path = write_model(tmp_path / "m")
    _retype_header(path, b'"F32"', b'"I32"')
    err = _df004(path, "I32", "floating")
    assert err.context.get("tensor")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64, torch.bool, torch.float8_e4m3fn])
def test_non_float_weights_are_df004(tmp_path, dtype):
    for fmt in ("bin", "safetensors"):
        state = tiny_state(LLAMA_CONFIG)
        state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"].to(dtype)
        _df004(write_model(tmp_path / fmt, fmt=fmt, state=state), tensor="model.layers.1.mlp.up_proj.weight")


def test_integer_weights_in_zt_are_df004(tmp_path):
    state = tiny_state(LLAMA_CONFIG)
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.int32)
    _df004(write_model(tmp_path / "m", fmt="zt", state=state), "floating", tensor="model.norm.weight")


@pytest.mark.parametrize("layers", [0, -1, 1, True])
def test_num_hidden_layers_contradicting_a_two_layer_file_is_df004(tmp_path, layers):
    _df004(_with_config(tmp_path, LLAMA_CONFIG, num_hidden_layers=layers), "num_hidden_layers")


def test_bert_fewer_layers_than_the_file_holds_is_df004(tmp_path):
    _df004(_with_config(tmp_path, BERT_CONFIG, num_hidden_layers=1), "num_hidden_layers", "layer 1")


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1e-6])
@pytest.mark.parametrize(("base", "key"), [(LLAMA_CONFIG, "rms_norm_eps"), (BERT_CONFIG, "layer_norm_eps")])
def test_non_finite_or_negative_eps_is_df004(tmp_path, base, key, value):
    _df004(_with_config(tmp_path, base, **{key: value}), repr(key))


def test_infinity_token_in_config_json_is_df004(tmp_path):
    path = write_model(tmp_path / "m")
    write_config(tmp_path / "m", json.dumps(LLAMA_CONFIG)[:-1] + ', "rms_norm_eps": Infinity}')
    _df004(path, "'rms_norm_eps'")


def test_bert_heads_not_dividing_hidden_is_df004(tmp_path):
    _df004(_with_config(tmp_path, BERT_CONFIG, num_attention_heads=3), "num_attention_heads=3", "hidden_size=16")


@pytest.mark.parametrize("changes", [
    {"num_key_value_heads": 0}, {"num_key_value_heads": 3}, {"head_dim": 0}, {"head_dim": 3},
    {"num_attention_heads": 0}, {"vocab_size": 0}, {"hidden_size": -16},
    {"pad_token_id": 32}, {"max_position_embeddings": 0},
])
def test_impossible_llama_sizes_are_df004(tmp_path, changes):
    key = next(iter(changes))
    _df004(_with_config(tmp_path, LLAMA_CONFIG, **changes), key)


# ------------------------------------------------------------------ read as transformers reads it
UNSUPPORTED = [
    {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
     "rope_parameters": {"rope_type": "default"}},
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
    {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
    {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
    {"partial_rotary_factor": 0.5},
    {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32}},
    {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
    {"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]},
]


@pytest.mark.parametrize("changes", UNSUPPORTED, ids=range(len(UNSUPPORTED)))
def test_configs_the_reference_does_not_implement_run_on_the_generic_tier(tmp_path, changes):
    """The reference written from the math refuses them (DF004, never a wrong reading); the loader
    then runs them on the generic tier (the model's own transformers code judges), saying why, or,
    where transformers itself refuses the config, DF004."""
    from debug_framework.modelio.configs import UnsupportedByReference

    cfg = {**LLAMA_CONFIG, "model_type": changes.get("model_type", LLAMA_CONFIG["model_type"])}
    with pytest.raises(UnsupportedByReference, match="not supported"):
        parse_config(json.loads(json.dumps({**cfg, **changes})))
    d = tmp_path / "m"
    write_model(d, cfg)
    write_config(d, {**cfg, **changes})
    try:
        model = load_model(d / "model.safetensors")
    except ModelLoadingError as exc:  # transformers refuses it too
        assert exc.code == "DF004" and "module_backend" in str(exc)
        return
    assert model.architecture == "generic" and "not supported" in model.config.why_generic


SUPPORTED_ROPE = [
    {},
    {"rope_theta": 500.0},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 300.0},
    {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "default", "rope_theta": 77.0}},
    {"rope_scaling": {"rope_type": "linear", "factor": 3.0}, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
    {"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 99.0}},
    {"rope_scaling": None, "rope_theta": 1234.0},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 77.0}, "rope_theta": 55.0},
    {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
    {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16, "rope_theta": 5e5}},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "type": "yarn"}},
    # Qwen2's default max_position_embeddings (32768) is llama3's original_max_position_embeddings
    {"model_type": "qwen2", "max_position_embeddings": None,
     "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
]


@pytest.mark.parametrize("changes", SUPPORTED_ROPE, ids=range(len(SUPPORTED_ROPE)))
def test_rope_frequencies_match_transformers(changes):
    """Where both rope_scaling and rope_parameters (and rope_theta) are given, the reference reads
    the same frequencies as transformers' own rotary embedding."""
    transformers = pytest.importorskip("transformers")
    from debug_framework.architectures.llama import rope_inverse_frequencies

    raw = {k: v for k, v in {**LLAMA_CONFIG, **changes}.items() if v is not None}
    config = parse_config(json.loads(json.dumps(raw)))
    ours = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    hf_config = transformers.AutoConfig.for_model(**json.loads(json.dumps(raw)))
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    rotary = Qwen2RotaryEmbedding if raw["model_type"] == "qwen2" else LlamaRotaryEmbedding
    theirs = rotary(hf_config).inv_freq.double().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


# ------------------------------------------------------------------ end to end: a refusal, never a verdict
@pytest.mark.parametrize("damage", ["yarn", "i32"])
def test_debug_validate_refuses_the_model_with_df004_exit_2(tmp_path, capsys, damage):
    """Before: a yarn config ran (the reference reading it as default rope) and an I32 weight loaded
    and validated; now debug_validate stops at the model with DF004 and exit 2 (a yarn config where
    the from-math reference is asked for)."""
    from debug_framework.cli.debug_validate import run

    path = write_model(tmp_path / "m")
    if damage == "yarn":
        write_config(tmp_path / "m", {**LLAMA_CONFIG, "rope_parameters": {"rope_type": "default"},
                                      "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32}})
    else:
        _retype_header(path, b'"F32"', b'"I32"')
    db = tmp_path / "db" / "sessions.db"
    # a yarn config runs on the generic tier; the reference written from the math refuses it
    code = run(["--model-path", str(path), "--alternative-backend", "pytorch", "--database", str(db),
                "--no-isolate", "--reference-backend", "python_reference"])
    err = capsys.readouterr().err
    assert code == 2 and "DF004" in err, err
    assert ("yarn" if damage == "yarn" else "I32") in err
