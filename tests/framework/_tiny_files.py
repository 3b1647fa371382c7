"""Tiny models written straight to disk in every weights format (no transformers, milliseconds each):
the builders of the model-loading hardening and fuzz tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from debug_framework.modelio import expected_tensors, parse_config

#: A two-layer Llama small enough to write hundreds of times a second.
LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
#: A two-layer BERT of the same size.
BERT_CONFIG: dict[str, Any] = {
    "model_type": "bert", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0,
}
FORMATS = ("safetensors", "sharded", "bin", "zt")


def tiny_state(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 tensors of every shape ``config`` implies."""
    gen = torch.Generator().manual_seed(seed)
    return {name: 0.1 * torch.randn(shape, generator=gen) for name, shape in expected_tensors(parse_config(config)).items()}


def write_config(directory: Path, config: dict[str, Any] | str) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    (directory / "config.json").write_text(text, encoding="utf-8")


def write_sharded(directory: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Two safetensors shards and ``model.safetensors.index.json``; returns the index written."""
    names = sorted(state)
    half = len(names) // 2
    weight_map: dict[str, str] = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, str(directory / shard))
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    return index


def write_zt_file(path: Path, state: dict[str, torch.Tensor]) -> None:
    import ztensor

    dtypes = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
              torch.int32: "i32", torch.int64: "i64"}
    with ztensor.Writer(str(path)) as w:
        for key in sorted(state):
            t = state[key].detach().contiguous()
            w.add(key, t.view(-1).view(torch.uint8).numpy(), list(t.shape), dtypes[t.dtype])
        w.finish()


def write_model(directory: Path, config: dict[str, Any] | None = None, fmt: str = "safetensors",
                state: dict[str, torch.Tensor] | None = None, seed: int = 0) -> Path:
    """A tiny model in ``fmt`` (``safetensors``, ``sharded``, ``bin`` or ``zt``) with its config.json;
    returns the path to hand to ``load_model`` (the directory for ``sharded``, else the weights file)."""
    config = dict(LLAMA_CONFIG if config is None else config)
    directory.mkdir(parents=True, exist_ok=True)
    state = tiny_state(config, seed) if state is None else state
    write_config(directory, config)
    if fmt == "sharded":
        write_sharded(directory, state)
        return directory
    if fmt == "safetensors":
        path = directory / "model.safetensors"
        save_file(state, str(path))
    elif fmt == "bin":
        path = directory / "pytorch_model.bin"
        torch.save(state, str(path))
    elif fmt == "zt":
        path = directory / "model.zt"
        write_zt_file(path, state)
    else:
        raise ValueError(fmt)
    return path
