"""The Llama family and BERT written for Apple's MLX, step for step as the NumPy references in
``debug_framework.architectures`` (one small function per step, shapes in the docstrings).

MLX runs on the Metal GPU of Apple silicon and on the CPU elsewhere; arrays are lazy, so callers
``mx.eval`` what they keep. Checkpoints are keyed by ``(name, layer)`` tuples like the references.

Shapes: B batch, T tokens, D hidden, H query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from ..architectures.llama import rope_inverse_frequencies
from ..architectures.walk import walk_checkpoints

__all__ = [
    "MX_DTYPES",
    "linear",
    "softmax",
    "masked_scores",
    "rms_norm",
    "layer_norm",
    "rope_cos_sin",
    "apply_rotary",
    "causal_padding_mask",
    "padding_mask",
    "attention",
    "silu",
    "gelu",
    "gelu_tanh",
    "MLXLlama",
    "MLXBert",
    "build_mlx_model",
]

MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

Key = tuple[str, "int | None"]


# -- shared steps ---------------------------------------------------------------------------------
def linear(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """``x @ weight.T + bias``; weight is ``[out, in]`` as in ``torch.nn.Linear``."""
    y = x @ weight.T
    return y if bias is None else y + bias


def softmax(x: mx.array) -> mx.array:
    """Numerically stable softmax over the last axis (computed in the input's dtype)."""
    z = x - mx.max(x, axis=-1, keepdims=True)
    e = mx.exp(z)
    return e / mx.sum(e, axis=-1, keepdims=True)


def masked_scores(scores: mx.array, allowed: mx.array) -> mx.array:
    """The dtype's most negative value where ``allowed`` is False (a fully masked row stays finite)."""
    return mx.where(allowed, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))


def attention(q: mx.array, k: mx.array, v: mx.array, allowed: mx.array) -> mx.array:
    """Scaled dot-product attention; each of the K key/value heads serves H/K query heads.

    q ``[B, H, T, E]``, k and v ``[B, K, T, E]``, allowed broadcastable to ``[B, H, T, T]``.
    """
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = mx.repeat(k, group, axis=1)  # query head h reads key/value head h // group
        v = mx.repeat(v, group, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(q.shape[-1])  # [B, H, T, T]
    return softmax(masked_scores(scores, allowed)) @ v


# -- Llama family ---------------------------------------------------------------------------------
def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""
    return x / mx.sqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_cos_sin(length: int, inv_freq: np.ndarray, dtype: Any) -> tuple[mx.array, mx.array]:
    """cos and sin of ``position * frequency`` (float64 angles, as the reference), ``[T, E]``."""
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return mx.array(np.cos(angles).astype(np.float32)).astype(dtype), mx.array(np.sin(angles).astype(np.float32)).astype(dtype)


def apply_rotary(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """Rotate pairs (x_i, x_{i+E/2}) by the position's angle. x ``[B, heads, T, E]``."""
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def causal_padding_mask(attention_mask: mx.array) -> mx.array:
    """``allowed[b, 1, i, j]``: j <= i and j is not padding. ``[B, 1, T, T]``."""
    t = attention_mask.shape[1]
    causal = mx.tril(mx.ones((t, t), dtype=mx.bool_))
    return causal[None, None] & (attention_mask[:, None, None, :] != 0)


def silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``."""
    return x / (1.0 + mx.exp(-x))


# -- BERT -----------------------------------------------------------------------------------------
def layer_norm(x: mx.array, weight: mx.array, bias: mx.array, eps: float) -> mx.array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance)."""
    mean = mx.mean(x, axis=-1, keepdims=True)
    var = mx.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / mx.sqrt(var + eps) * weight + bias


def gelu(x: mx.array) -> mx.array:
    """Exact GELU, ``x/2 * (1 + erf(x / sqrt 2))``."""
    return 0.5 * x * (1.0 + mx.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: mx.array) -> mx.array:
    """The tanh approximation of GELU."""
    return 0.5 * x * (1.0 + mx.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def padding_mask(attention_mask: mx.array) -> mx.array:
    """``allowed[b, 1, 1, j]``: key j is not padding. ``[B, 1, 1, T]``."""
    return (attention_mask != 0)[:, None, None, :]


ACTIVATIONS = {"gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "relu": lambda x: mx.maximum(x, 0)}


class _Weights:
    """Reads canonical tensors from a ``WeightStore`` as MLX arrays of one dtype."""

    def __init__(self, weights: Any, dtype: Any) -> None:
        self.weights, self.dtype = weights, dtype

    def __call__(self, name: str) -> mx.array | None:
        if name not in self.weights:
            return None
        host = np.asarray(self.weights.numpy(name, np.float32) if hasattr(self.weights, "numpy") else self.weights[name], np.float32)
        return mx.array(host).astype(self.dtype)


class MLXLlama:
    """A Llama-family decoder (GQA, rope scaling, optional q/k/v/o bias, tied or untied head)."""

    def __init__(self, config: Any, weights: Any, dtype: Any = mx.float32) -> None:
        self.config, self.dtype = config, dtype
        get = _Weights(weights, dtype)
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

    def embed(self, input_ids: mx.array) -> mx.array:
        """Token embedding lookup. ``[B, T] -> [B, T, D]``."""
        return self.embed_tokens[input_ids]

    def attention(self, i: int, x: mx.array, attention_mask: mx.array) -> mx.array:
        """Layer i's self-attention on the normalised stream x ``[B, T, D]``."""
        c, w = self.config, self.layers[i]
        b, t, _ = x.shape

        def heads(y: mx.array, n: int) -> mx.array:  # [B, T, n*E] -> [B, n, T, E]
            return y.reshape(b, t, n, c.head_dim).transpose(0, 2, 1, 3)

        q = heads(linear(x, w["q"], w["q_b"]), c.num_attention_heads)
        k = heads(linear(x, w["k"], w["k_b"]), c.num_key_value_heads)
        v = heads(linear(x, w["v"], w["v_b"]), c.num_key_value_heads)
        cos, sin = rope_cos_sin(t, self.inv_freq, self.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attention(q, k, v, causal_padding_mask(attention_mask))  # [B, H, T, E]
        out = out.transpose(0, 2, 1, 3).reshape(b, t, c.num_attention_heads * c.head_dim)
        return linear(out, w["o"], w["o_b"])

    def mlp(self, i: int, x: mx.array) -> mx.array:
        """``down(silu(gate(x)) * up(x))``."""
        w = self.layers[i]
        return linear(silu(linear(x, w["gate"], w["gate_b"])) * linear(x, w["up"], w["up_b"]), w["down"], w["down_b"])

    def layer(self, i: int, h: mx.array, attention_mask: mx.array) -> tuple[mx.array, mx.array]:
        """Decoder layer i: returns (post_attention, post_mlp)."""
        w, eps = self.layers[i], self.config.rms_norm_eps
        a = h + self.attention(i, rms_norm(h, w["input_norm"], eps), attention_mask)
        return a, a + self.mlp(i, rms_norm(a, w["post_attention_norm"], eps))

    def head(self, h: mx.array) -> mx.array:
        """Final norm and the LM head: logits ``[B, T, V]``."""
        return rms_norm(h, self.norm, self.config.rms_norm_eps) @ self.lm_head.T

    def forward(self, input_ids: mx.array, attention_mask: mx.array, want: set[Key] | None = None,
                layer_inputs: dict[int, mx.array] | None = None, token_type_ids: mx.array | None = None) -> dict[Key, mx.array]:
        """Run the model; the checkpoints in ``want`` (all when ``None``), keyed ``(name, layer)``."""
        return walk_checkpoints(self.embed(input_ids), self.config.num_hidden_layers,
                                lambda i, h: self.layer(i, h, attention_mask), self.head, want, layer_inputs)


class MLXBert:
    """A post-LN BERT encoder (word + position + token type embeddings, padding mask)."""

    def __init__(self, config: Any, weights: Any, dtype: Any = mx.float32) -> None:
        self.config, self.dtype = config, dtype
        self.act = ACTIVATIONS[config.hidden_act]
        get = _Weights(weights, dtype)
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

    def embed(self, input_ids: mx.array, token_type_ids: mx.array | None = None) -> mx.array:
        """Word + absolute position + token type embeddings, then LayerNorm. ``[B, T] -> [B, T, D]``."""
        t = input_ids.shape[1]
        tt = mx.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word[input_ids] + self.position[mx.arange(t)][None] + self.token_type[tt]
        return layer_norm(x, *self.emb_ln, self.config.layer_norm_eps)

    def attention(self, i: int, h: mx.array, attention_mask: mx.array) -> mx.array:
        """Layer i's multi-head self-attention and output projection (before the residual)."""
        c, w = self.config, self.layers[i]
        b, t, _ = h.shape

        def heads(x: mx.array) -> mx.array:  # [B, T, D] -> [B, H, T, E]
            return x.reshape(b, t, c.num_attention_heads, c.head_dim).transpose(0, 2, 1, 3)

        q, k, v = (heads(linear(h, w[n], w[n + "_b"])) for n in ("query", "key", "value"))
        ctx = attention(q, k, v, padding_mask(attention_mask))
        ctx = ctx.transpose(0, 2, 1, 3).reshape(b, t, c.hidden_size)
        return linear(ctx, w["attn_out"], w["attn_out_b"])

    def layer(self, i: int, h: mx.array, attention_mask: mx.array) -> tuple[mx.array, mx.array]:
        """Encoder layer i (post-LN): returns (post_attention, post_mlp)."""
        w, eps = self.layers[i], self.config.layer_norm_eps
        a = layer_norm(h + self.attention(i, h, attention_mask), *w["attn_ln"], eps)
        mlp = linear(self.act(linear(a, w["up"], w["up_b"])), w["down"], w["down_b"])
        return a, layer_norm(a + mlp, *w["out_ln"], eps)

    def forward(self, input_ids: mx.array, attention_mask: mx.array, want: set[Key] | None = None,
                layer_inputs: dict[int, mx.array] | None = None, token_type_ids: mx.array | None = None) -> dict[Key, mx.array]:
        """Run the encoder; the checkpoints in ``want`` (all when ``None``), keyed ``(name, layer)``."""
        return walk_checkpoints(self.embed(input_ids, token_type_ids), self.config.num_hidden_layers,
                                lambda i, h: self.layer(i, h, attention_mask), None, want, layer_inputs)


def build_mlx_model(config: Any, weights: Any, dtype: Any = mx.float32) -> MLXLlama | MLXBert:
    """The MLX model for ``config.architecture`` (``"llama"`` or ``"bert"``)."""
    if config.architecture == "llama":
        return MLXLlama(config, weights, dtype)
    if config.architecture == "bert":
        return MLXBert(config, weights, dtype)
    from ..errors import ModelLoadingError

    raise ModelLoadingError(f"no MLX implementation of architecture {config.architecture!r}")
