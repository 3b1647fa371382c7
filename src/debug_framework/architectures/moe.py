"""A sparse mixture-of-experts decoder (Qwen3-MoE) written from the math, over any array namespace (:mod:`.xp`).
Attention as Qwen3's (:mod:`.decoder`); each layer's MLP is a mixture of experts:

    router_logits = x W_r^T                                   [B, T, X]   (X experts)
    p             = softmax(router_logits)
    g_e           = p_e if e is among the k most probable experts of the token, else 0
    g             = g / sum(g)                                 (when norm_topk_prob)
    moe(x)        = sum_e g_e * down_e(silu(gate_e(x)) * up_e(x))

Every expert runs on every token here and the unchosen ones are weighted by zero: the sum is the
one the sparse dispatch computes, expert by expert in index order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..modelio.configs import MoeModelConfig
from .decoder import DecoderReference, decoder_layout
from .layout import WeightLayout, WeightSource
from .llama import silu
from .ops import linear, softmax
from .walk import Key
from .xp import NUMPY, Array, ArrayNamespace, array_namespace

__all__ = ["top_k_gates", "expert_mlp", "MoeReference"]


def top_k_gates(router_logits: Array, k: int, renormalise: bool) -> Array:
    """The experts' weights per token: the softmax of the router's logits kept for the ``k``
    largest (the rest zero), renormalised to sum to one when ``renormalise``. ``[..., X]``."""
    xp = array_namespace(router_logits)
    p = softmax(router_logits)
    kth = xp.sort(p)[..., -k:][..., :1]  # the k-th largest probability of each token
    gates = xp.where(p >= kth, p, xp.zeros_like(p))
    return gates / gates.sum(axis=-1, keepdims=True) if renormalise else gates


def _as_is(name: str, value: Array) -> Array:
    return value


def expert_mlp(x: Array, gate: Array, up: Array, down: Array,
               tap: Callable[[str, Array], Array] = _as_is) -> Array:
    """One expert: ``down(silu(gate(x)) * up(x))``; ``tap`` sees the down projection's input (``experts_act``)."""
    return linear(tap("experts_act", silu(linear(x, gate)) * linear(x, up)), down)


class MoeReference(DecoderReference):
    """A Qwen3-MoE decoder (arguments: see :class:`~.walk.Model`). After a run, :attr:`router_logits`
    holds each layer's router logits ``[B, T, X]`` (checkpoint ``("router_logits", i)`` when asked for,
    as ``[B*T, X]``: one row per token, as transformers' router returns them)."""

    config: MoeModelConfig

    def __init__(self, config: MoeModelConfig, weights: WeightSource, dtype: object = np.float64,
                 xp: ArrayNamespace = NUMPY, *, stream: bool | None = None) -> None:
        super().__init__(config, weights, dtype, xp, stream=stream)
        #: layer -> the router logits of the last run (or replay) of that layer
        self.router_logits: dict[int, Array] = {}

    @classmethod
    def layout_for(cls, config: MoeModelConfig) -> WeightLayout:  # type: ignore[override]
        """The decoder's layout with the router and each expert's three projections instead of one MLP."""
        base = decoder_layout(config, mlp=False)
        experts = {"router": "mlp.gate.weight"}
        for e in range(config.num_experts):
            for proj in ("gate", "up", "down"):
                experts[f"expert{e}_{proj}"] = f"mlp.experts.{e}.{proj}_proj.weight"
        return WeightLayout(base.model, base.layer_prefix, {**base.layer, **experts}, base.optional)

    def mlp(self, i: int, x: Array) -> Array:
        """Layer i's mixture of experts on the normalised stream x ``[B, T, D]``. Taps (``Model.tap``):
        the router's input (``router_in``) and logits (``router_logits``), the experts' input
        (``experts_in``) and each one's down-projection input (``experts_act``), the sum (``ffn_out``)."""
        c, w, tap = self.config, self.layers[i], self.tap
        logits = tap("router_logits", linear(tap("router_in", x), w["router"]))
        self.router_logits[i] = logits
        gates = top_k_gates(logits, c.num_experts_per_tok, c.norm_topk_prob)
        xe = tap("experts_in", x)
        out = self.xp.zeros_like(x)
        for e in range(c.num_experts):
            y = expert_mlp(xe, w[f"expert{e}_gate"], w[f"expert{e}_up"], w[f"expert{e}_down"], tap)
            out = out + gates[..., e:e + 1] * y
        return tap("ffn_out", out)

    def forward(self, input_ids: Array, attention_mask: Array, want: set[Key] | None = None,
                layer_inputs: dict[int, Array] | None = None, token_type_ids: Array | None = None) -> dict[Key, Array]:
        """:meth:`~.walk.Model.forward`, plus ``("router_logits", i)`` for each layer asked for (all when ``want`` is None)."""
        self.router_logits.clear()
        out = super().forward(input_ids, attention_mask, want, layer_inputs, token_type_ids)
        for i, logits in self.router_logits.items():
            if want is None or ("router_logits", i) in want:
                out[("router_logits", i)] = logits.reshape(-1, logits.shape[-1])  # [tokens, experts]
        return out
