"""The Llama family (Llama, Qwen2-style q/k/v bias) written from the math, in NumPy.

    h0 = embed(ids)
    for each layer:  a = h + attention(rms_norm(h))          -> post_attention
                     h = a + mlp(rms_norm(a))                -> post_mlp
    logits = rms_norm(h) @ lm_head.T                         -> post_processing

Shapes: B batch, T tokens, D hidden, H query heads, K key/value heads, E head dim, F MLP width.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..modelio.configs import LlamaModelConfig, RopeScaling
from .ops import linear, masked_scores, softmax
from .walk import walk_checkpoints

__all__ = [
    "rms_norm",
    "rope_inverse_frequencies",
    "rope_cos_sin",
    "apply_rotary",
    "causal_padding_mask",
    "grouped_query_attention",
    "silu",
    "gated_mlp",
    "LlamaReference",
]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """``theta^(-2i/E)`` for i < E/2, with linear or llama3 frequency scaling applied. ``[E/2]``."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        old_len = scaling.original_max_position_embeddings
        low_freq_wavelen = old_len / scaling.low_freq_factor
        high_freq_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return np.where(medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``position * frequency``, each frequency used for both halves. ``[T, E]``."""
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, E/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, E]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x_i, x_{i+E/2}) by the position's angle. x: ``[B, heads, T, E]``."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def causal_padding_mask(attention_mask: np.ndarray) -> np.ndarray:
    """``allowed[b, 1, i, j]``: query i may see key j if j <= i and j is not padding. ``[B, 1, T, T]``."""
    t = attention_mask.shape[1]
    causal = np.tril(np.ones((t, t), dtype=bool))
    return causal[None, None, :, :] & (attention_mask[:, None, None, :] != 0)


def grouped_query_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Scaled dot-product attention; each of the K key/value heads serves H/K query heads.

    q: ``[B, H, T, E]``, k and v: ``[B, K, T, E]`` -> ``[B, H, T, E]``.
    """
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1)  # query head h reads key/value head h // group
    v = np.repeat(v, group, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])  # [B, H, T, T]
    return softmax(masked_scores(scores, allowed)) @ v


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``."""
    return x / (1.0 + np.exp(-x))


def gated_mlp(x: np.ndarray, w: dict[str, np.ndarray | None]) -> np.ndarray:
    """``down(silu(gate(x)) * up(x))``."""
    return linear(silu(linear(x, w["gate"], w["gate_b"])) * linear(x, w["up"], w["up_b"]), w["down"], w["down_b"])


class LlamaReference:
    """A Llama-family decoder with its weights converted to ``dtype`` (float64 or float32).

    Args:
        config: the typed config.
        weights: canonical name -> tensor (a ``WeightStore`` or any mapping with ``.numpy``-able values).
        dtype: compute dtype.
    """

    def __init__(self, config: LlamaModelConfig, weights: Any, dtype: Any = np.float64) -> None:
        self.config = config
        self.dtype = np.dtype(dtype)

        def get(name: str) -> np.ndarray | None:
            if name not in weights:
                return None
            return np.asarray(weights.numpy(name, self.dtype) if hasattr(weights, "numpy") else weights[name], self.dtype)

        self.embed_tokens = get("model.embed_tokens.weight")
        self.layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                {
                    "input_norm": get(p + "input_layernorm.weight"),
                    "post_attention_norm": get(p + "post_attention_layernorm.weight"),
                    **{n: get(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v", "o")},
                    **{n + "_b": get(p + f"self_attn.{n}_proj.bias") for n in ("q", "k", "v", "o")},
                    **{n: get(p + f"mlp.{n}_proj.weight") for n in ("gate", "up", "down")},
                    **{n + "_b": get(p + f"mlp.{n}_proj.bias") for n in ("gate", "up", "down")},
                }
            )
        self.norm = get("model.norm.weight")
        lm_head = None if config.tie_word_embeddings else get("lm_head.weight")
        self.lm_head = self.embed_tokens if lm_head is None else lm_head
        self.inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)

    # -- the steps -------------------------------------------------------------------------------
    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        """Token embedding lookup. ``[B, T] -> [B, T, D]``."""
        return self.embed_tokens[input_ids]

    def attention(self, i: int, x: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Layer i's self-attention on the normalised stream x ``[B, T, D]``."""
        c, w = self.config, self.layers[i]
        b, t, _ = x.shape
        q = linear(x, w["q"], w["q_b"]).reshape(b, t, c.num_attention_heads, c.head_dim).transpose(0, 2, 1, 3)
        k = linear(x, w["k"], w["k_b"]).reshape(b, t, c.num_key_value_heads, c.head_dim).transpose(0, 2, 1, 3)
        v = linear(x, w["v"], w["v_b"]).reshape(b, t, c.num_key_value_heads, c.head_dim).transpose(0, 2, 1, 3)
        cos, sin = rope_cos_sin(np.arange(t), self.inv_freq, self.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = grouped_query_attention(q, k, v, causal_padding_mask(attention_mask))  # [B, H, T, E]
        out = out.transpose(0, 2, 1, 3).reshape(b, t, c.num_attention_heads * c.head_dim)
        return linear(out, w["o"], w["o_b"])

    def layer(self, i: int, h: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decoder layer i: returns (post_attention, post_mlp)."""
        w, eps = self.layers[i], self.config.rms_norm_eps
        a = h + self.attention(i, rms_norm(h, w["input_norm"], eps), attention_mask)
        out = a + gated_mlp(rms_norm(a, w["post_attention_norm"], eps), w)
        return a, out

    def head(self, h: np.ndarray) -> np.ndarray:
        """Final norm and the LM head: logits ``[B, T, V]``."""
        return rms_norm(h, self.norm, self.config.rms_norm_eps) @ self.lm_head.T

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        want: set[tuple[str, int | None]] | None = None,
        layer_inputs: dict[int, np.ndarray] | None = None,
        token_type_ids: np.ndarray | None = None,
    ) -> dict[tuple[str, int | None], np.ndarray]:
        """Run the model; return the checkpoints in ``want`` (all when ``None``) keyed ``(name, layer)``.

        When ``layer_inputs`` is a dict, each layer's input hidden state is stored in it.
        """
        return walk_checkpoints(self.embed(input_ids), self.config.num_hidden_layers,
                                lambda i, h: self.layer(i, h, attention_mask), self.head, want, layer_inputs)
