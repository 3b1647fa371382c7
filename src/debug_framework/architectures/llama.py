"""The Llama family (Llama, Qwen2-style q/k/v bias) written from the math, over any array namespace (:mod:`.xp`).

    h0 = embed(ids)
    for each layer:  a = h + attention(rms_norm(h))          -> post_attention
                     h = a + mlp(rms_norm(a))                -> post_mlp
    logits = rms_norm(h) @ lm_head.T                         -> post_processing

Shapes: B batch, T tokens, D hidden, H query heads, K key/value heads, E head dim, F MLP width.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..modelio.configs import LlamaModelConfig, RopeScaling
from .kv_cache import last_queries
from .layout import Parameters, WeightLayout, WeightSource, weight_and_bias
from .ops import linear, merge_heads, scaled_dot_product_attention, split_heads
from .walk import Model
from .xp import NUMPY, Array, ArrayNamespace, DType, array_namespace

__all__ = [
    "LAYOUT",
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

_LINEAR = dict(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj",
               gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj")

#: Hugging Face ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` names; biases and an untied head are optional.
LAYOUT = WeightLayout(
    model={"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"},
    layer_prefix="model.layers.{i}.",
    layer={"input_norm": "input_layernorm.weight", "post_attention_norm": "post_attention_layernorm.weight",
           **weight_and_bias(**_LINEAR)},
    optional=frozenset({"lm_head", *(p + "_b" for p in _LINEAR)}),
)


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""
    variance = (x * x).mean(axis=-1, keepdims=True)
    return x / array_namespace(x).sqrt(variance + eps) * weight


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """``theta^(-2i/E)`` for i < E/2, with linear or llama3 frequency scaling applied. ``[E/2]``, float64."""
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


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray, dtype: DType,
                 xp: ArrayNamespace = NUMPY) -> tuple[Array, Array]:
    """cos and sin of ``position * frequency``, each frequency used for both halves, computed in
    float64 on the host and handed to ``xp`` in ``dtype``. ``[T, E]``."""
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, E/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, E]
    return xp.from_host(np.cos(angles), dtype), xp.from_host(np.sin(angles), dtype)


def apply_rotary(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate pairs (x_i, x_{i+E/2}) by the position's angle. x: ``[B, heads, T, E]``."""
    half = x.shape[-1] // 2
    rotated = array_namespace(x).concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def causal_padding_mask(attention_mask: Array) -> Array:
    """``allowed[b, 1, i, j]``: query i may see key j if j <= i and j is not padding. ``[B, 1, T, T]``."""
    causal = array_namespace(attention_mask).lower_triangle(attention_mask.shape[1])
    return causal[None, None, :, :] & (attention_mask[:, None, None, :] != 0)


#: q ``[B, H, T, E]``, k and v ``[B, K, T, E]``: each key/value head serves H/K query heads.
grouped_query_attention = scaled_dot_product_attention


def silu(x: Array) -> Array:
    """``x * sigmoid(x)``."""
    return x / (1.0 + array_namespace(x).exp(-x))


def _as_is(name: str, value: Array) -> Array:
    return value


def gated_mlp(x: Array, w: Parameters, tap: Callable[[str, Array], Array] = _as_is) -> Array:
    """``down(silu(gate(x)) * up(x))``; ``tap`` sees each step's value (``Model.tap``)."""
    gate, up = tap("ffn_gate", linear(x, w["gate"], w["gate_b"])), tap("ffn_up", linear(x, w["up"], w["up_b"]))
    return tap("ffn_out", linear(tap("ffn_act", silu(gate) * up), w["down"], w["down_b"]))


class LlamaReference(Model):
    """A Llama-family decoder (arguments: see :class:`~.walk.Model`)."""

    layout = LAYOUT
    config: LlamaModelConfig

    def __init__(self, config: LlamaModelConfig, weights: WeightSource, dtype: object = np.float64,
                 xp: ArrayNamespace = NUMPY, *, stream: bool | None = None) -> None:
        super().__init__(config, weights, dtype, xp, stream=stream)
        if config.tie_word_embeddings or not self.params.present("lm_head"):
            self.params.alias("lm_head", "embed_tokens")
        self.inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        self._rope: dict[int, tuple[Array, Array]] = {}

    # -- the steps -------------------------------------------------------------------------------
    def embed(self, input_ids: Array, token_type_ids: Array | None = None) -> Array:
        """Token embedding lookup (decoders have no token types). ``[B, T] -> [B, T, D]``."""
        return self.params.rows("embed_tokens", input_ids)

    def rope(self, length: int) -> tuple[Array, Array]:
        """cos and sin for positions ``0 .. length-1`` (computed once per length), or for each
        row's own :attr:`positions` (``[B, 1, T, E]``) where they are set."""
        return self.rope_at(self.inv_freq, self._rope, length)

    def rope_at(self, inv_freq: np.ndarray, cache: dict[int, tuple[Array, Array]],
                length: int) -> tuple[Array, Array]:
        """cos and sin of ``inv_freq`` at this call's positions (``cache`` holds the ``0 .. T-1`` ones)."""
        pos = self.positions
        if pos is not None and pos.ndim == 2 and pos.shape[1] == length:
            b = pos.shape[0]
            cos, sin = rope_cos_sin(np.asarray(pos, np.int64).reshape(-1), inv_freq, self.dtype, self.xp)
            return cos.reshape(b, 1, length, -1), sin.reshape(b, 1, length, -1)
        if length not in cache:
            cache[length] = rope_cos_sin(np.arange(length), inv_freq, self.dtype, self.xp)
        return cache[length]

    def attention(self, i: int, x: Array, attention_mask: Array) -> Array:
        """Layer i's self-attention on the normalised stream x ``[B, T, D]``."""
        c, w, tap = self.config, self.layers[i], self.tap
        q = split_heads(tap("q", linear(x, w["q"], w["q_b"])), c.num_attention_heads, c.head_dim)
        k = split_heads(tap("k", linear(x, w["k"], w["k_b"])), c.num_key_value_heads, c.head_dim)
        v = split_heads(tap("v", linear(x, w["v"], w["v_b"])), c.num_key_value_heads, c.head_dim)
        cos, sin = self.rope(x.shape[1])
        q, k = tap("q_rope", apply_rotary(q, cos, sin)), tap("k_rope", apply_rotary(k, cos, sin))
        k, v = self.cached(i, k, v)  # [B, K, L, E]: the cached positions, then these
        allowed = last_queries(causal_padding_mask(attention_mask), q.shape[2])  # attention_mask: [B, L]
        out = grouped_query_attention(q, k, v, allowed)  # [B, H, T, E]
        return tap("attn_out", linear(tap("attn", merge_heads(out)), w["o"], w["o_b"]))

    def attention_block(self, i: int, h: Array, attention_mask: Array) -> Array:
        """Layer i's attention block (pre-norm, residual): ``h + attention(rms_norm(h))``, the post_attention state."""
        w = self.layers[i]
        return h + self.attention(i, self.tap("attn_norm", rms_norm(h, w["input_norm"], self.config.rms_norm_eps)),
                                  attention_mask)

    def mlp_block(self, i: int, a: Array) -> Array:
        """Layer i's MLP block on the post-attention state: ``a + gated_mlp(rms_norm(a))``, post_mlp."""
        w = self.layers[i]
        return a + gated_mlp(self.tap("ffn_norm", rms_norm(a, w["post_attention_norm"], self.config.rms_norm_eps)),
                             w, self.tap)

    def head(self, h: Array) -> Array:
        """Final norm and the LM head: logits ``[B, T, V]``."""
        return self.params.project("lm_head", rms_norm(h, self.params["norm"], self.config.rms_norm_eps))
