"""Fixtures of the engine tests: tiny random Llama-family models on disk, and user backends
(NumPy Llama implementations in float32) with one injected bug each."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # no network, ever, in these tests
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from debug_framework.architectures.llama import (  # noqa: E402
    LlamaReference,
    apply_rotary,
    causal_padding_mask,
    gated_mlp,
    grouped_query_attention,
    rms_norm,
    rope_cos_sin,
)
from debug_framework.architectures.ops import linear  # noqa: E402
from debug_framework.backends import register_backend, unregister_backend, user_backend  # noqa: E402
from debug_framework.capture import CheckpointKey  # noqa: E402

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6)


def make_tiny(kind: str, directory: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random Llama / Qwen2 decoder saved with ``save_pretrained`` (safetensors + config)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg = {**TINY, **overrides}
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**cfg))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale, base = (0.1, 1.0) if "norm" in name else (0.08, 0.0)
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """6-layer Llama (GQA 4/2 heads), HF directory."""
    return make_tiny("llama", tmp_path_factory.mktemp("tiny_llama") / "hf")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """6-layer Qwen2 (q/k/v bias), HF directory."""
    return make_tiny("qwen2", tmp_path_factory.mktemp("tiny_qwen2") / "hf", seed=3)


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "debug.db"


# ---------------------------------------------------------------------------------------------
# a user's own NumPy implementation, with one bug injected
# ---------------------------------------------------------------------------------------------


def rotate_interleaved(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The GPT-J rotary variant: rotates (x_0, x_1), (x_2, x_3)... -- wrong for Llama weights."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out


def padding_only_mask(attention_mask: np.ndarray) -> np.ndarray:
    """The causal-mask bug: padding is masked but every query also sees future tokens."""
    t = attention_mask.shape[1]
    return np.broadcast_to(attention_mask[:, None, None, :] != 0, (attention_mask.shape[0], 1, t, t))


class MyLlama(LlamaReference):
    """A user's Llama in NumPy float32, with ``bug`` in {None, "rope", "causal_mask", "eps_layer3"}."""

    def __init__(self, config, weights, dtype=np.float32, bug: str | None = None) -> None:
        super().__init__(config, weights, dtype)
        self.bug = bug

    def attention(self, i, x, attention_mask):
        c, w = self.config, self.layers[i]
        b, t, _ = x.shape
        q = linear(x, w["q"], w["q_b"]).reshape(b, t, c.num_attention_heads, c.head_dim).transpose(0, 2, 1, 3)
        k = linear(x, w["k"], w["k_b"]).reshape(b, t, c.num_key_value_heads, c.head_dim).transpose(0, 2, 1, 3)
        v = linear(x, w["v"], w["v_b"]).reshape(b, t, c.num_key_value_heads, c.head_dim).transpose(0, 2, 1, 3)
        cos, sin = rope_cos_sin(np.arange(t), self.inv_freq, self.dtype)
        rotate = rotate_interleaved if self.bug == "rope" else apply_rotary
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        mask = padding_only_mask(attention_mask) if self.bug == "causal_mask" else causal_padding_mask(attention_mask)
        out = grouped_query_attention(q, k, v, mask).transpose(0, 2, 1, 3).reshape(b, t, -1)
        return linear(out, w["o"], w["o_b"])

    def layer(self, i, h, attention_mask):
        w = self.layers[i]
        eps = 1e-1 if (self.bug == "eps_layer3" and i == 3) else self.config.rms_norm_eps
        a = h + self.attention(i, rms_norm(h, w["input_norm"], eps), attention_mask)
        return a, a + gated_mlp(rms_norm(a, w["post_attention_norm"], eps), w)


class MyRunner:
    """The user-backend runner: ``run(inputs, keys)``, ``run_layer(i, hidden_in, inputs)`` and
    ``run_block(i, block, hidden_in, inputs)``."""

    def __init__(self, model, dtype, device, bug=None, with_run_layer=True):
        self.net = MyLlama(model.config, model.weights, np.dtype(dtype), bug)
        if not with_run_layer:
            self.run_layer = None  # type: ignore[assignment]
            del self.run_layer

    def run(self, inputs, keys):
        out = self.net.forward(inputs.input_ids, inputs.attention_mask, {tuple(k) for k in keys})
        return {CheckpointKey(*k): v for k, v in out.items()}

    def run_layer(self, i, hidden_in, inputs):
        h = np.asarray(hidden_in.detach().cpu().numpy() if hasattr(hidden_in, "detach") else hidden_in, self.net.dtype)
        return self.net.layer(i, h, inputs.attention_mask)

    def run_block(self, i, block, hidden_in, inputs):
        h = np.asarray(hidden_in.detach().cpu().numpy() if hasattr(hidden_in, "detach") else hidden_in, self.net.dtype)
        return self.net.block(i, block, h, inputs.attention_mask)[1]


@pytest.fixture
def my_backend():
    """Register ``my_llama_<bug>`` user backends for the test; returns a function bug -> name."""
    names: list[str] = []

    def make(bug: str | None = None, *, run_layer: bool = True, name: str | None = None) -> str:
        name = name or f"my_llama_{bug or 'ok'}{'' if run_layer else '_norl'}"

        def builder(model, dtype, device):
            return MyRunner(model, dtype, device, bug, run_layer)

        register_backend(name, user_backend(name, builder, dtypes=("float32",)), replace=True)
        names.append(name)
        return name

    yield make
    for n in names:
        unregister_backend(n)
