"""The Llama family's variants written from the math, over any array namespace (:mod:`.xp`): Mistral (a sliding
window), Qwen3 (an RMS norm over each head's queries and keys), Phi-3 (fused q/k/v and gate/up
projections), and the shared machinery of the Gemma (``.gemma``) and mixture-of-experts (``.moe``)
decoders: a per-layer attention type, an attention scale and a soft-cap on the attention scores.

    for each layer:  a = h + attention_i(rms_norm(h))                -> post_attention
                     h = a + mlp(rms_norm(a))                        -> post_mlp
    attention_i:     q, k, v = W_q x, W_k x, W_v x     (Phi-3: one W_qkv x, split)
                     q, k = rms_norm(q), rms_norm(k)   per head (Qwen3)
                     q, k = rotate(q), rotate(k)
                     softmax(cap(scale * q k^T), allowed_i) v     allowed_i: causal, and within the
                                                                  sliding window in sliding layers
                                                                  (counted in cache columns or in
                                                                  each row's tokens: window_counts)

Shapes: B batch, T tokens, D hidden, H query heads, K key/value heads, E head dim, F MLP width.
"""

from __future__ import annotations

import numpy as np

from ..modelio.configs import LlamaModelConfig
from .bert import gelu, gelu_tanh
from .kv_cache import last_queries
from .layout import WeightLayout, WeightSource, weight_and_bias
from .llama import LlamaReference, apply_rotary, causal_padding_mask, rms_norm, rope_cos_sin, silu
from .ops import linear, masked_scores, merge_heads, softmax, split_heads
from .xp import NUMPY, Array, ArrayNamespace, array_namespace

__all__ = ["ACTIVATIONS", "decoder_layout", "sliding_window_mask", "count_windows_in", "soft_cap", "split_last", "attention_with_scale",
           "DecoderReference"]


#: the MLP activations the decoders' configs name.
ACTIVATIONS = {"silu": silu, "gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh}


def decoder_layout(config: LlamaModelConfig, *, mlp: bool = True, norms: tuple[str, ...] = ()) -> WeightLayout:
    """The Hugging Face names of a Llama-family decoder as ``config`` declares it: fused or separate
    projections, q/k norms, the extra ``norms`` of a layer (Gemma's), the dense MLP unless ``mlp`` is
    False (a mixture of experts declares its own). Biases and an untied head are optional."""
    if config.fused_projections:
        linears = dict(qkv="self_attn.qkv_proj", o="self_attn.o_proj")
    else:
        linears = dict(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj")
    if mlp:
        linears |= (dict(gate_up="mlp.gate_up_proj", down="mlp.down_proj") if config.fused_projections
                    else dict(gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj"))
    layer = {"input_norm": "input_layernorm.weight", "post_attention_norm": "post_attention_layernorm.weight",
             **{n: f"{n_hf}_layernorm.weight" for n, n_hf in ((n, n.removesuffix("_norm")) for n in norms)},
             **weight_and_bias(**linears)}
    if config.qk_norm:
        layer |= {"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
    return WeightLayout(
        model={"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"},
        layer_prefix="model.layers.{i}.",
        layer=layer,
        optional=frozenset({"lm_head", *(p + "_b" for p in linears)}),
    )


def sliding_window_mask(attention_mask: Array, window: int, counts: str = "columns") -> Array:
    """``allowed[b, 1, i, j]``: causal and padding as :func:`~.llama.causal_padding_mask`, and key j
    at most ``window - 1`` positions before query i. ``[B, 1, T, T]``.

    ``counts`` says in what the distance is counted: ``"columns"`` (``i - window < j``, padding
    columns inside the window counted, as transformers' masks do) or ``"tokens"`` (fewer than
    ``window`` real tokens after key j up to query i: each row as a sequence of its own, as an engine
    that runs rows unpadded computes it). The two differ only where padding lies between a row's
    tokens: a decode step after a right-padded prompt, its new token after the padding columns."""
    xp, t = array_namespace(attention_mask), attention_mask.shape[1]
    if counts == "tokens":
        return causal_padding_mask(attention_mask) & _token_band(attention_mask, window)
    if counts != "columns":
        raise ValueError(f"a window counts 'columns' or 'tokens', not {counts!r}")
    band = xp.lower_triangle(t) != xp.lower_triangle(t, -window)  # j <= i, and not j <= i - window
    return causal_padding_mask(attention_mask) & band[None, None, :, :]


def _token_band(attention_mask: Array, window: int) -> Array:
    """``[B, 1, T, T]``: ``position(i) - position(j) < window`` in each row's own positions (its
    attention mask's cumulative count of tokens), built on the host (an attention mask is small)."""
    xp = array_namespace(attention_mask)
    position = np.cumsum(np.asarray(attention_mask) != 0, axis=1)  # [B, T]: tokens up to each column
    band = (position[:, :, None] - position[:, None, :]) < window  # [B, T(query), T(key)]
    return xp.from_host(band[:, None].astype(np.float32), xp.dtype("float32")) > 0


def count_windows_in(net: object, counts: str) -> None:
    """Have the model ``net`` count its sliding windows in ``counts`` (``"columns"`` or ``"tokens"``,
    :func:`sliding_window_mask`): a decoder's :attr:`DecoderReference.window_counts`; a model
    without sliding windows has nothing to count."""
    if counts not in ("columns", "tokens"):
        raise ValueError(f"a window counts 'columns' or 'tokens', not {counts!r}")
    if isinstance(net, DecoderReference):
        net.window_counts = counts


def soft_cap(x: Array, cap: float | None) -> Array:
    """``cap * tanh(x / cap)``: x squashed smoothly into ``(-cap, cap)``; x itself when ``cap`` is None."""
    return x if cap is None else cap * array_namespace(x).tanh(x / cap)


def split_last(x: Array, sizes: tuple[int, ...]) -> list[Array]:
    """``x`` cut along its last axis into consecutive pieces of ``sizes`` (a fused projection's outputs)."""
    out, start = [], 0
    for size in sizes:
        out.append(x[..., start:start + size])
        start += size
    return out


def attention_with_scale(q: Array, k: Array, v: Array, allowed: Array, scale: float,
                         cap: float | None = None) -> Array:
    """``softmax(masked(cap(scale * q k^T))) v``, each of the K key/value heads serving H/K query
    heads. q ``[B, H, T, E]``, k and v ``[B, K, T, E]`` -> ``[B, H, T, E]``."""
    group = q.shape[1] // k.shape[1]
    xp = array_namespace(k)
    if group > 1:
        k, v = xp.repeat(k, group, axis=1), xp.repeat(v, group, axis=1)
    scores = soft_cap(q @ xp.permute(k, (0, 1, 3, 2)) * scale, cap)  # [B, H, T, T]
    return softmax(masked_scores(scores, allowed)) @ v


class DecoderReference(LlamaReference):
    """A Llama-family decoder with the variants its config declares (arguments: see :class:`~.walk.Model`)."""

    #: the soft-cap of the attention scores (Gemma 2).
    attention_cap: float | None = None

    #: what a sliding window counts on a padded row (:func:`sliding_window_mask`): ``"columns"``
    #: (transformers' semantics, the default) or ``"tokens"`` (each row its own sequence); set by the
    #: backend as the session's alternative declares (``backends.capabilities.WINDOW_COUNTS``)
    window_counts: str = "columns"

    def __init__(self, config: LlamaModelConfig, weights: WeightSource, dtype: object = np.float64,
                 xp: ArrayNamespace = NUMPY, *, stream: bool | None = None) -> None:
        self.layout = self.layout_for(config)
        super().__init__(config, weights, dtype, xp, stream=stream)
        #: the rotary frequencies of the sliding-window layers (Gemma 3's differ from the global ones).
        self.local_inv_freq = self.inv_freq
        self._local_rope: dict[int, tuple[Array, Array]] = {}

    @classmethod
    def layout_for(cls, config: LlamaModelConfig) -> WeightLayout:
        """The family's weight layout for ``config``."""
        return decoder_layout(config)

    # -- the steps -------------------------------------------------------------------------------
    def norm(self, x: Array, weight: Array) -> Array:
        """The family's RMS norm (Llama's: ``x / rms(x) * w``)."""
        return rms_norm(x, weight, self.config.rms_norm_eps)

    def rope_of(self, i: int, length: int) -> tuple[Array, Array]:
        """Layer i's cos and sin (Gemma 3's sliding layers rotate with their own base)."""
        if not self.config.is_sliding(i) or self.local_inv_freq is self.inv_freq:
            return self.rope(length)
        return self.rope_at(self.local_inv_freq, self._local_rope, length)

    def allowed(self, i: int, attention_mask: Array) -> Array:
        """Which keys each query of layer i sees: causal (and padding), within the window if it slides
        (counted as :attr:`window_counts` says)."""
        return (sliding_window_mask(attention_mask, self.config.sliding_window, self.window_counts)
                if self.config.is_sliding(i)
                else causal_padding_mask(attention_mask))

    def project_qkv(self, i: int, x: Array) -> tuple[Array, Array, Array]:
        """Queries ``[B, H, T, E]``, keys and values ``[B, K, T, E]`` of layer i, q/k-normed per head where the family does."""
        c, w = self.config, self.layers[i]
        hq, hkv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        if c.fused_projections:
            q, k, v = split_last(linear(x, w["qkv"], w["qkv_b"]), (hq, hkv, hkv))
        else:
            q, k, v = linear(x, w["q"], w["q_b"]), linear(x, w["k"], w["k_b"]), linear(x, w["v"], w["v_b"])
        q, k = split_heads(q, c.num_attention_heads, c.head_dim), split_heads(k, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.norm(q, w["q_norm"]), self.norm(k, w["k_norm"])
        return q, k, split_heads(v, c.num_key_value_heads, c.head_dim)

    def attention(self, i: int, x: Array, attention_mask: Array) -> Array:
        """Layer i's self-attention on the normalised stream x ``[B, T, D]``."""
        w = self.layers[i]
        q, k, v = self.project_qkv(i, x)
        cos, sin = self.rope_of(i, x.shape[1])
        q, k = self.tap("q_rope", apply_rotary(q, cos, sin)), self.tap("k_rope", apply_rotary(k, cos, sin))
        k, v = self.cached(i, k, v)  # [B, K, L, E]: the cached positions, then these
        allowed = last_queries(self.allowed(i, attention_mask), q.shape[2])  # attention_mask: [B, L]
        out = attention_with_scale(q, k, v, allowed, self.config.attention_scale, self.attention_cap)
        return self.tap("attn_out", linear(self.tap("attn", merge_heads(out)), w["o"], w["o_b"]))

    def mlp(self, i: int, x: Array) -> Array:
        """Layer i's gated MLP: ``down(act(gate(x)) * up(x))`` (Phi-3: gate and up from one projection)."""
        w, act = self.layers[i], ACTIVATIONS[self.config.hidden_act]
        if self.config.fused_projections:
            gate, up = split_last(linear(x, w["gate_up"], w["gate_up_b"]), (self.config.intermediate_size,) * 2)
        else:
            gate, up = linear(x, w["gate"], w["gate_b"]), linear(x, w["up"], w["up_b"])
        gate, up = self.tap("ffn_gate", gate), self.tap("ffn_up", up)
        return self.tap("ffn_out", linear(self.tap("ffn_act", act(gate) * up), w["down"], w["down_b"]))

    def attention_block(self, i: int, h: Array, attention_mask: Array) -> Array:
        """``h + attention(norm(h))``: the post_attention state."""
        return h + self.attention(i, self.tap("attn_norm", self.norm(h, self.layers[i]["input_norm"])), attention_mask)

    def mlp_block(self, i: int, a: Array) -> Array:
        """``a + mlp(norm(a))``: post_mlp."""
        return a + self.mlp(i, self.tap("ffn_norm", self.norm(a, self.layers[i]["post_attention_norm"])))

    def head(self, h: Array) -> Array:
        """Final norm and the LM head: logits ``[B, T, V]``."""
        return self.params.project("lm_head", self.norm(h, self.params["norm"]))

