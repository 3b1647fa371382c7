"""The BERT encoder written from the math, in NumPy.

    h0 = layer_norm(word[ids] + position[t] + token_type[tt])           -> post_embedding
    for each layer:  a = layer_norm(h + attention(h))                   -> post_attention
                     h = layer_norm(a + W2 gelu(W1 a))                  -> post_mlp
    last hidden state = h                                               -> post_processing

Shapes: B batch, T tokens, D hidden, H heads, E = D / H head dim.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..modelio.configs import BertModelConfig
from .ops import erf, linear, masked_scores, softmax
from .walk import walk_checkpoints

__all__ = ["layer_norm", "gelu", "gelu_tanh", "padding_mask", "self_attention", "activation", "BertReference"]


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))`` (``hidden_act: "gelu"``)."""
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU (``gelu_new`` / ``gelu_pytorch_tanh``)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def activation(name: str):
    """The activation function a BERT config names."""
    return {"gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "relu": lambda x: np.maximum(x, 0)}[name]


def padding_mask(attention_mask: np.ndarray) -> np.ndarray:
    """``allowed[b, 1, 1, j]``: every query may see key j unless j is padding. ``[B, 1, 1, T]``."""
    return (attention_mask != 0)[:, None, None, :]


def self_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Scaled dot-product attention. q, k, v: ``[B, H, T, E]`` -> ``[B, H, T, E]``."""
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    return softmax(masked_scores(scores, allowed)) @ v


class BertReference:
    """A BERT encoder with its weights converted to ``dtype`` (float64 or float32)."""

    def __init__(self, config: BertModelConfig, weights: Any, dtype: Any = np.float64) -> None:
        self.config = config
        self.dtype = np.dtype(dtype)
        self.act = activation(config.hidden_act)

        def get(name: str) -> np.ndarray:
            return np.asarray(weights.numpy(name, self.dtype) if hasattr(weights, "numpy") else weights[name], self.dtype)

        e = "embeddings."
        self.word = get(e + "word_embeddings.weight")
        self.position = get(e + "position_embeddings.weight")
        self.token_type = get(e + "token_type_embeddings.weight")
        self.emb_ln = (get(e + "LayerNorm.weight"), get(e + "LayerNorm.bias"))
        self.layers = []
        for i in range(config.num_hidden_layers):
            p = f"encoder.layer.{i}."
            self.layers.append(
                {
                    **{n: get(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")},
                    **{n + "_b": get(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")},
                    "attn_out": get(p + "attention.output.dense.weight"),
                    "attn_out_b": get(p + "attention.output.dense.bias"),
                    "attn_ln": (get(p + "attention.output.LayerNorm.weight"), get(p + "attention.output.LayerNorm.bias")),
                    "up": get(p + "intermediate.dense.weight"),
                    "up_b": get(p + "intermediate.dense.bias"),
                    "down": get(p + "output.dense.weight"),
                    "down_b": get(p + "output.dense.bias"),
                    "out_ln": (get(p + "output.LayerNorm.weight"), get(p + "output.LayerNorm.bias")),
                }
            )

    # -- the steps -------------------------------------------------------------------------------
    def embed(self, input_ids: np.ndarray, token_type_ids: np.ndarray | None = None) -> np.ndarray:
        """Word + absolute position + token type embeddings, then LayerNorm. ``[B, T] -> [B, T, D]``."""
        t = input_ids.shape[1]
        tt = np.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word[input_ids] + self.position[np.arange(t)][None] + self.token_type[tt]
        return layer_norm(x, *self.emb_ln, self.config.layer_norm_eps)

    def attention(self, i: int, h: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Layer i's multi-head self-attention and output projection (before the residual)."""
        c, w = self.config, self.layers[i]
        b, t, _ = h.shape

        def heads(x: np.ndarray) -> np.ndarray:  # [B, T, D] -> [B, H, T, E]
            return x.reshape(b, t, c.num_attention_heads, c.head_dim).transpose(0, 2, 1, 3)

        q, k, v = (heads(linear(h, w[n], w[n + "_b"])) for n in ("query", "key", "value"))
        ctx = self_attention(q, k, v, padding_mask(attention_mask))
        ctx = ctx.transpose(0, 2, 1, 3).reshape(b, t, c.hidden_size)
        return linear(ctx, w["attn_out"], w["attn_out_b"])

    def layer(self, i: int, h: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Encoder layer i (post-LN): returns (post_attention, post_mlp)."""
        w, eps = self.layers[i], self.config.layer_norm_eps
        a = layer_norm(h + self.attention(i, h, attention_mask), *w["attn_ln"], eps)
        mlp = linear(self.act(linear(a, w["up"], w["up_b"])), w["down"], w["down_b"])
        return a, layer_norm(a + mlp, *w["out_ln"], eps)

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        want: set[tuple[str, int | None]] | None = None,
        layer_inputs: dict[int, np.ndarray] | None = None,
        token_type_ids: np.ndarray | None = None,
    ) -> dict[tuple[str, int | None], np.ndarray]:
        """Run the encoder; return the checkpoints in ``want`` (all when ``None``) keyed ``(name, layer)``."""
        return walk_checkpoints(self.embed(input_ids, token_type_ids), self.config.num_hidden_layers,
                                lambda i, h: self.layer(i, h, attention_mask), None, want, layer_inputs)
