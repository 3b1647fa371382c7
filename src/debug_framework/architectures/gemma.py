"""The Gemma 2 and Gemma 3 text decoders written from the math, over any array namespace (:mod:`.xp`).

    h0 = embed(ids) * sqrt(D)                                              -> post_embedding
    for each layer:  a = h + norm(attention_i(norm(h)))                    -> post_attention
                     h = a + norm(mlp(norm(a)))                            -> post_mlp
    logits = cap(norm(h) @ embed.T)                                        -> post_processing

    norm(x)          = x / sqrt(mean(x^2) + eps) * (1 + w)      (the weight is stored less one)
    mlp(x)           = down(gelu_tanh(gate(x)) * up(x))
    attention_i      scores = cap(q k^T / sqrt(query_pre_attn_scalar)); local (sliding-window) and
                     global layers alternate (Gemma 2: every other layer; Gemma 3: five local, one global)
    cap(x)           = c * tanh(x / c)   (Gemma 2's attention scores and final logits; none in Gemma 3)

Gemma 3 also normalises each head's queries and keys (``(1 + w)`` norms) and rotates its local
layers with their own base (``rope_local_base_freq``). Shapes as in :mod:`.llama`.
"""

from __future__ import annotations

import math

import numpy as np

from ..modelio.configs import GemmaModelConfig
from .decoder import DecoderReference, decoder_layout, soft_cap
from .layout import WeightLayout, WeightSource
from .llama import rms_norm, rope_inverse_frequencies
from .xp import NUMPY, Array, ArrayNamespace

__all__ = ["gemma_rms_norm", "GemmaReference"]


def gemma_rms_norm(x: Array, weight: Array, eps: float) -> Array:
    """``x / sqrt(mean(x^2) + eps) * (1 + weight)``: Gemma stores the scale less one."""
    return rms_norm(x, 1.0 + weight, eps)


class GemmaReference(DecoderReference):
    """A Gemma 2 / Gemma 3 text decoder (arguments: see :class:`~.walk.Model`)."""

    config: GemmaModelConfig

    def __init__(self, config: GemmaModelConfig, weights: WeightSource, dtype: object = np.float64,
                 xp: ArrayNamespace = NUMPY, *, stream: bool | None = None) -> None:
        super().__init__(config, weights, dtype, xp, stream=stream)
        self.attention_cap = config.attn_logit_softcapping
        if config.local_rope_theta is not None:
            self.local_inv_freq = rope_inverse_frequencies(config.head_dim, config.local_rope_theta,
                                                           config.local_rope_scaling)
        # sqrt(D) rounded to the compute dtype, as the model multiplies its embeddings by it
        self.embed_scale = xp.from_host(np.asarray(math.sqrt(config.hidden_size)), self.dtype)

    @classmethod
    def layout_for(cls, config: GemmaModelConfig) -> WeightLayout:  # type: ignore[override]
        """Llama's layout plus the norms before and after the MLP."""
        return decoder_layout(config, norms=("pre_feedforward_norm", "post_feedforward_norm"))

    # -- the steps -------------------------------------------------------------------------------
    def norm(self, x: Array, weight: Array) -> Array:
        """Gemma's RMS norm, ``(1 + w)``-scaled."""
        return gemma_rms_norm(x, weight, self.config.rms_norm_eps)

    def embed(self, input_ids: Array, token_type_ids: Array | None = None) -> Array:
        """Token embeddings scaled by ``sqrt(hidden_size)``. ``[B, T] -> [B, T, D]``."""
        return self.params.rows("embed_tokens", input_ids) * self.embed_scale

    def attention_block(self, i: int, h: Array, attention_mask: Array) -> Array:
        """``h + norm(attention(norm(h)))``: the post_attention state."""
        w = self.layers[i]
        return h + self.norm(self.attention(i, self.norm(h, w["input_norm"]), attention_mask), w["post_attention_norm"])

    def mlp_block(self, i: int, a: Array) -> Array:
        """``a + norm(mlp(norm(a)))``: post_mlp."""
        w = self.layers[i]
        return a + self.norm(self.mlp(i, self.norm(a, w["pre_feedforward_norm"])), w["post_feedforward_norm"])

    def head(self, h: Array) -> Array:
        """Final norm, the LM head and the final soft-cap: logits ``[B, T, V]``."""
        return soft_cap(super().head(h), self.config.final_logit_softcapping)
