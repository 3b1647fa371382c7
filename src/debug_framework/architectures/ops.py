"""The steps both model families share, over any array namespace (see :mod:`.xp`).

Shapes: B batch, T tokens, H query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import math

from .xp import Array, array_namespace

__all__ = ["linear", "softmax", "masked_scores", "split_heads", "merge_heads", "scaled_dot_product_attention"]


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    """``x @ weight.T + bias``; weight is ``[out, in]`` as in ``torch.nn.Linear``. A batch of
    sequences ``[B, T, in]`` is multiplied as one ``[B * T, in]`` matrix: one pass over the weight
    instead of one per sequence (the product of a batch is matrix by matrix in NumPy)."""
    if len(x.shape) == 3 and len(weight.shape) == 2:
        b, t, d = x.shape
        y = (x.reshape(b * t, d) @ weight.T).reshape(b, t, weight.shape[0])
        return y if bias is None else y + bias
    y = x @ weight.T
    return y if bias is None else y + bias


def softmax(x: Array) -> Array:
    """Numerically stable softmax over the last axis, in the input's dtype."""
    xp = array_namespace(x)
    e = xp.exp(x - xp.amax(x, -1))
    return e / e.sum(axis=-1, keepdims=True)


def masked_scores(scores: Array, allowed: Array) -> Array:
    """Put the dtype's most negative value where ``allowed`` is False (as HF does, so a fully
    masked row becomes uniform instead of NaN)."""
    xp = array_namespace(scores)
    return xp.where(allowed, scores, xp.lowest(scores.dtype))


def split_heads(x: Array, heads: int, head_dim: int) -> Array:
    """``[B, T, heads * E] -> [B, heads, T, E]``."""
    b, t, _ = x.shape
    return array_namespace(x).permute(x.reshape(b, t, heads, head_dim), (0, 2, 1, 3))


def merge_heads(x: Array) -> Array:
    """``[B, H, T, E] -> [B, T, H * E]``."""
    b, h, t, e = x.shape
    return array_namespace(x).permute(x, (0, 2, 1, 3)).reshape(b, t, h * e)


def scaled_dot_product_attention(q: Array, k: Array, v: Array, allowed: Array) -> Array:
    """``softmax(q k^T / sqrt(E), masked) v``; each of the K key/value heads serves H/K query heads
    (K == H: plain multi-head attention).

    q ``[B, H, T, E]``, k and v ``[B, K, T, E]``, allowed broadcastable to ``[B, H, T, T]`` -> ``[B, H, T, E]``.
    """
    group = q.shape[1] // k.shape[1]
    xp = array_namespace(k)
    if group > 1:
        k = xp.repeat(k, group, axis=1)  # query head h reads key/value head h // group
        v = xp.repeat(v, group, axis=1)
    scores = q @ xp.permute(k, (0, 1, 3, 2)) / math.sqrt(q.shape[-1])  # [B, H, T, T]
    return softmax(masked_scores(scores, allowed)) @ v

