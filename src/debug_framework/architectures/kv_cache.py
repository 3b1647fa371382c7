"""The KV cache of the decoders written from the math: each layer's rotated keys and values,
appended pass by pass, so that a decode step attends over every token before it.

    prefill:      K_i, V_i = rotate(W_k x), W_v x          for the prompt's T tokens (padding included)
    decode step:  K_i <- [K_i ; rotate(W_k x_new)]         the new token rotated at its own position
                  V_i <- [V_i ; W_v x_new]
                  out  = softmax(q_new K_i^T, allowed) V_i  allowed: the last row(s) of the mask over
                                                          all L cached positions (padding, causality,
                                                          the sliding window of a local layer)

The new token of a row whose prompt was right-padded sits after the padding columns. A sliding
window counted in cache columns (transformers') then holds fewer of the row's tokens than one
counted in the row's own tokens (an engine running each row as its own sequence, llama.cpp):
``DecoderReference.window_counts`` says which, as the session's alternative declares.

Nothing is evicted: a sliding-window layer keeps every key and its mask leaves out those that left
the window (an engine that evicts them holds the trailing ones; the comparison aligns the two).
Shapes: B batch, K key/value heads, L cached positions, E head dim.
"""

from __future__ import annotations

from .xp import Array, array_namespace

__all__ = ["KVCache", "last_queries"]


class KVCache:
    """Per layer, the keys and values of every position so far, ``[B, K, L, E]`` each."""

    def __init__(self) -> None:
        self.keys: dict[int, Array] = {}
        self.values: dict[int, Array] = {}

    def append(self, i: int, k: Array, v: Array) -> tuple[Array, Array]:
        """Layer i's new keys and values ``[B, K, T, E]`` appended after its cached ones; returns
        all of them ``[B, K, L + T, E]`` (a new array: what an earlier pass returned stays as it was)."""
        if i in self.keys:
            xp = array_namespace(k)
            k = xp.concatenate([self.keys[i], k], axis=2)
            v = xp.concatenate([self.values[i], v], axis=2)
        self.keys[i], self.values[i] = k, v
        return k, v

    def layers(self) -> dict[int, tuple[Array, Array]]:
        """Each layer's keys and values as ``[B, L, K, E]`` (the layout the KV-cache comparison reads)."""
        xp = {i: array_namespace(k) for i, k in self.keys.items()}
        return {i: (xp[i].permute(self.keys[i], (0, 2, 1, 3)), xp[i].permute(self.values[i], (0, 2, 1, 3)))
                for i in sorted(self.keys)}


def last_queries(allowed: Array, t: int) -> Array:
    """The rows of the last ``t`` queries of a mask ``[B, 1, L, L]`` over all cached positions:
    a pass of ``t`` new tokens over ``L - t`` cached ones sees what those queries see. ``[B, 1, t, L]``."""
    return allowed[..., allowed.shape[-2] - t:, :]
