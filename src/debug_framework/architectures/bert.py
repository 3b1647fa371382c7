"""The BERT encoder written from the math, over any array namespace (:mod:`.xp`).

    h0 = layer_norm(word[ids] + position[t] + token_type[tt])           -> post_embedding
    for each layer:  a = layer_norm(h + attention(h))                   -> post_attention
                     h = layer_norm(a + W2 gelu(W1 a))                  -> post_mlp
    last hidden state = h                                               -> post_processing

Shapes: B batch, T tokens, D hidden, H heads, E = D / H head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..modelio.configs import BertModelConfig
from .layout import WeightLayout, weight_and_bias
from .ops import linear, merge_heads, scaled_dot_product_attention, split_heads
from .walk import Model
from .xp import Array, array_namespace

__all__ = ["LAYOUT", "layer_norm", "gelu", "gelu_tanh", "relu", "activation", "padding_mask", "self_attention",
           "BertReference"]

#: Hugging Face ``BertModel`` names (every tensor required).
LAYOUT = WeightLayout(
    model={"word": "embeddings.word_embeddings.weight", "position": "embeddings.position_embeddings.weight",
           "token_type": "embeddings.token_type_embeddings.weight", **weight_and_bias(emb_ln="embeddings.LayerNorm")},
    layer_prefix="encoder.layer.{i}.",
    layer=weight_and_bias(query="attention.self.query", key="attention.self.key", value="attention.self.value",
                          attn_out="attention.output.dense", attn_ln="attention.output.LayerNorm",
                          up="intermediate.dense", down="output.dense", out_ln="output.LayerNorm"),
)


def layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / array_namespace(x).sqrt(var + eps) * weight + bias


def gelu(x: Array) -> Array:
    """Exact GELU, ``x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))`` (``hidden_act: "gelu"``)."""
    return 0.5 * x * (1.0 + array_namespace(x).erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Array) -> Array:
    """The tanh approximation of GELU (``gelu_new`` / ``gelu_pytorch_tanh``)."""
    return 0.5 * x * (1.0 + array_namespace(x).tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def relu(x: Array) -> Array:
    """``max(x, 0)``."""
    return array_namespace(x).maximum(x, 0)


_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "relu": relu}


def activation(name: str) -> Callable[[Array], Array]:
    """The activation function a BERT config names."""
    return _ACTIVATIONS[name]


def padding_mask(attention_mask: Array) -> Array:
    """``allowed[b, 1, 1, j]``: every query may see key j unless j is padding. ``[B, 1, 1, T]``."""
    return (attention_mask != 0)[:, None, None, :]


#: q, k, v ``[B, H, T, E]`` -> ``[B, H, T, E]`` (multi-head: as many key/value heads as query heads).
self_attention = scaled_dot_product_attention


class BertReference(Model):
    """A post-LN BERT encoder (arguments: see :class:`~.walk.Model`)."""

    layout = LAYOUT
    config: BertModelConfig

    # -- the steps -------------------------------------------------------------------------------
    def embed(self, input_ids: Array, token_type_ids: Array | None = None) -> Array:
        """Word + absolute position + token type embeddings, then LayerNorm. ``[B, T] -> [B, T, D]``."""
        p = self.params
        tt = self.xp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        pos = self.positions
        where = p["position"][: input_ids.shape[1]][None] if pos is None else p["position"][np.asarray(pos, np.int64)]
        x = p.rows("word", input_ids) + where + p["token_type"][tt]
        return layer_norm(x, p["emb_ln"], p["emb_ln_b"], self.config.layer_norm_eps)

    def attention(self, i: int, h: Array, attention_mask: Array) -> Array:
        """Layer i's multi-head self-attention and output projection (before the residual)."""
        c, w, tap = self.config, self.layers[i], self.tap
        q, k, v = (split_heads(tap(t, linear(h, w[n], w[n + "_b"])), c.num_attention_heads, c.head_dim)
                   for t, n in (("q", "query"), ("k", "key"), ("v", "value")))
        ctx = self_attention(q, k, v, padding_mask(attention_mask))
        return tap("attn_out", linear(tap("attn", merge_heads(ctx)), w["attn_out"], w["attn_out_b"]))

    def attention_block(self, i: int, h: Array, attention_mask: Array) -> Array:
        """Layer i's attention block (post-LN): ``layer_norm(h + attention(h))``, the post_attention state."""
        w = self.layers[i]
        return layer_norm(h + self.attention(i, h, attention_mask), w["attn_ln"], w["attn_ln_b"],
                          self.config.layer_norm_eps)

    def mlp_block(self, i: int, a: Array) -> Array:
        """Layer i's MLP block on the post-attention state: ``layer_norm(a + down(act(up(a))))``, post_mlp."""
        w, act, tap = self.layers[i], activation(self.config.hidden_act), self.tap
        mlp = tap("ffn_out", linear(tap("ffn_act", act(tap("ffn_up", linear(a, w["up"], w["up_b"])))),
                                    w["down"], w["down_b"]))
        return layer_norm(a + mlp, w["out_ln"], w["out_ln_b"], self.config.layer_norm_eps)
