"""An example inference engine validated by ``debug_validate --decode-steps``: a Llama-family decoder
(Llama, Qwen2, Mistral with its sliding window) in NumPy (float32) that keeps its KV cache in
fixed-size pages, as paged engines do.

* The batch is packed: each row's tokens are run on their own, padded positions are never computed
  (the checkpoints read 0 there; the comparison leaves them out).
* Keys and values go into a pool of pages ``[pages, PAGE, kv_heads, head_dim]`` per layer; each row
  has a page table (the pages it owns, in order) and a length. Attention gathers a row's pages.
* It speaks the engine protocol of ``debug_framework.backends.decode.runner_decode``:
  ``prefill(inputs, keys)``, ``decode_step(tokens, positions, keys)`` and ``kv_cache()`` (and
  ``run(inputs, keys)``, the one forward pass every user backend has).
* It runs one layer alone on a given input: ``run_layer`` (isolation) and ``run_layer_traced``,
  which names its intermediate values (``attn_norm``, ``q``, ``q_rope`` ... ``post_mlp``): the
  drill-down by named values (docs/drilldown.md, "the trace strategy") compares them with the
  reference's and names the step that introduces an error.

Register it and validate it against the model's own code in float64::

    from debug_framework.backends import register_backend, user_backend
    from paged_kv_engine import PagedLlamaEngine

    register_backend("paged_numpy", user_backend("paged_numpy", PagedLlamaEngine, dtypes=("float32",)))
    # debug_validate --model-path llama-dir --backend-file examples/paged_kv_engine.py \
    #     --reference-backend float64_eager --alternative-backend paged_numpy --decode-steps 8
"""

from __future__ import annotations

from typing import Any

import numpy as np

from debug_framework.architectures import build_reference
from debug_framework.architectures.llama import rms_norm, rope_cos_sin, silu
from debug_framework.architectures.ops import linear, softmax

#: tokens per page
PAGE = 4


class PagedLlamaEngine:
    """``PagedLlamaEngine(model, dtype, device)``: the runner of a ``user_backend`` (float32, CPU)."""

    def __init__(self, model: Any, dtype: str = "float32", device: str = "cpu") -> None:
        self.net = build_reference(model.config, model.weights, np.float32)  # its weights and rotary frequencies
        c = model.config
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps = c.rms_norm_eps
        self.layers = c.num_hidden_layers
        self.pool_k: list[np.ndarray] = []
        self.pool_v: list[np.ndarray] = []
        self.tables: list[list[int]] = []  # per row: its pages in order
        self.lengths: list[int] = []  # per row: the tokens it holds
        self.slots: list[list[int]] = []  # per row: the logical index (padded layout) of each held token
        self.width = 0  # the logical length (padding included) of the batch so far

    # -- the paged cache ----------------------------------------------------------------------------
    def _reset(self, rows: int) -> None:
        shape = (0, PAGE, self.kv_heads, self.head_dim)
        self.pool_k = [np.zeros(shape, np.float32) for _ in range(self.layers)]
        self.pool_v = [np.zeros(shape, np.float32) for _ in range(self.layers)]
        self.tables, self.lengths, self.slots = [[] for _ in range(rows)], [0] * rows, [[] for _ in range(rows)]

    def _write(self, layer: int, row: int, k: np.ndarray, v: np.ndarray) -> None:
        """Append ``k``, ``v`` ``[n, kv_heads, head_dim]`` to ``row``'s pages (new pages as needed;
        the page count is shared by the layers, so layer 0 allocates)."""
        start = self.lengths[row]
        for j in range(k.shape[0]):
            at = start + j
            if at // PAGE >= len(self.tables[row]):  # the first layer to write there allocates for all
                self.tables[row].append(self.pool_k[0].shape[0])
                for pool in (self.pool_k, self.pool_v):
                    for i in range(self.layers):
                        pool[i] = np.concatenate([pool[i], np.zeros((1, *pool[i].shape[1:]), np.float32)])
            page = self.tables[row][at // PAGE]
            self.pool_k[layer][page, at % PAGE] = k[j]
            self.pool_v[layer][page, at % PAGE] = v[j]

    def _read(self, layer: int, row: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        pages = self.tables[row]
        k = self.pool_k[layer][pages].reshape(-1, self.kv_heads, self.head_dim)[:length]
        v = self.pool_v[layer][pages].reshape(-1, self.kv_heads, self.head_dim)[:length]
        return k, v

    # -- one row's layers ---------------------------------------------------------------------------
    def _rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cos, sin = rope_cos_sin(positions, self.net.inv_freq, np.dtype(np.float32))  # [n, E]
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    def _row(self, row: int, ids: np.ndarray, positions: np.ndarray, want: set[str]) -> dict[str, np.ndarray]:
        """Run ``row``'s new tokens ``ids`` ``[n]`` at ``positions`` over its cached ones."""
        net, out = self.net, {}
        h = net.params["embed_tokens"][ids]  # [n, D]
        out["post_embedding"] = h
        n, held = ids.shape[0], self.lengths[row]
        for i in range(self.layers):
            a, h = self._layer(i, row, h, positions, held)
            out[f"post_attention:{i}"], out[f"post_mlp:{i}"] = a, h
        self.lengths[row] = held + n
        out["post_processing"] = net.head(h)
        return {k: v for k, v in out.items() if k in want}

    def _layer(self, i: int, row: int, h: np.ndarray, positions: np.ndarray, held: int,
               note: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``i`` on ``row``'s new tokens' states ``h`` ``[n, D]`` over its ``held`` cached ones:
        (post_attention, post_mlp); each intermediate value named in ``note`` where given."""
        w, n = self.net.layers[i], h.shape[0]

        def tap(name: str, value: np.ndarray) -> np.ndarray:
            if note is not None:
                note[name] = value
            return value

        x = tap("attn_norm", rms_norm(h, w["input_norm"], self.eps))
        q = tap("q", linear(x, w["q"], w["q_b"])).reshape(n, self.heads, self.head_dim)
        k = tap("k", linear(x, w["k"], w["k_b"])).reshape(n, self.kv_heads, self.head_dim)
        v = tap("v", linear(x, w["v"], w["v_b"])).reshape(n, self.kv_heads, self.head_dim)
        q, k = tap("q_rope", self._rotate(q, positions)), tap("k_rope", self._rotate(k, positions))
        self._write(i, row, k, v)
        keys, values = self._read(i, row, held + n)  # [held + n, kv_heads, E]
        group = self.heads // self.kv_heads
        keys, values = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
        scores = np.einsum("qhe,khe->hqk", q, keys) / np.float32(np.sqrt(self.head_dim))
        scores = np.where(self._visible(i, held, n)[None], scores, np.finfo(np.float32).min)
        attn = tap("attn", np.einsum("hqk,khe->qhe", softmax(scores), values).reshape(n, -1))
        a = tap("post_attention", h + tap("attn_out", linear(attn, w["o"], w["o_b"])))
        x = tap("ffn_norm", rms_norm(a, w["post_attention_norm"], self.eps))
        gate, up = tap("ffn_gate", linear(x, w["gate"], w["gate_b"])), tap("ffn_up", linear(x, w["up"], w["up_b"]))
        mlp = tap("ffn_out", linear(tap("ffn_act", silu(gate) * up), w["down"], w["down_b"]))
        return a, tap("post_mlp", a + mlp)

    # -- one layer alone: isolation, and the drill-down by named values -----------------------------
    def run_layer_traced(self, i: int, hidden_in: Any, inputs: Any) -> dict[str, np.ndarray]:
        """Layer ``i`` alone on ``hidden_in`` ``[B, T, D]`` (each row's real tokens, over an empty
        cache), with its named intermediate values in the padded layout ``[B, T, ...]``."""
        hidden = np.asarray(hidden_in, np.float32)
        mask = inputs.attention_mask != 0
        rows, width = mask.shape
        given = inputs.position_ids()
        offset = int(inputs.meta.get("position_offset", 0) or 0)
        self._reset(rows)
        full: dict[str, np.ndarray] = {}
        for b in range(rows):
            where = np.flatnonzero(mask[b])
            positions = given[b, where] if given is not None else offset + np.arange(where.size)
            note: dict[str, np.ndarray] = {}
            self._layer(i, b, hidden[b, where], positions, 0, note)
            for name, value in note.items():
                if name not in full:
                    full[name] = np.zeros((rows, width, *value.shape[1:]), np.float32)
                full[name][b, where] = value
        return full

    def run_layer(self, i: int, hidden_in: Any, inputs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``i`` alone (isolation): its post_attention and post_mlp."""
        traced = self.run_layer_traced(i, hidden_in, inputs)
        return traced["post_attention"], traced["post_mlp"]

    def _visible(self, layer: int, held: int, n: int) -> np.ndarray:
        """``[n, held + n]``: new token q (the row's token ``held + q``) sees key j when ``j <= held + q``
        and, in a sliding-window layer (Mistral's), ``j > held + q - window`` (older keys are evicted).
        The window counts the row's own tokens; transformers counts cache slots, padding included,
        which differs once tokens are decoded after a right-padded row: validate it left-padded."""
        query, key = held + np.arange(n)[:, None], np.arange(held + n)[None, :]
        seen = key <= query
        window = self.net.config.sliding_window if self.net.config.is_sliding(layer) else None
        return seen if window is None else seen & (key > query - window)

    @staticmethod
    def _names(keys: Any) -> set[str]:
        return {str(k) for k in keys}

    # -- the engine protocol ------------------------------------------------------------------------
    def prefill(self, inputs: Any, keys: Any) -> dict[str, np.ndarray]:
        """The prompt, row by row (packed: padded positions are never computed; they read 0)."""
        ids, mask = inputs.input_ids, inputs.attention_mask != 0
        rows, width = ids.shape
        given = inputs.position_ids()
        offset = int(inputs.meta.get("position_offset", 0) or 0)
        self._reset(rows)
        self.width = width
        want, full = self._names(keys), {}
        for b in range(rows):
            where = np.flatnonzero(mask[b])
            positions = given[b, where] if given is not None else offset + np.arange(where.size)
            got = self._row(b, ids[b, where], positions, want)
            self.slots[b] = list(where)
            for name, value in got.items():
                if name not in full:
                    full[name] = np.zeros((rows, width, *value.shape[1:]), np.float32)
                full[name][b, where] = value
        return full

    def run(self, inputs: Any, keys: Any) -> dict[str, np.ndarray]:
        """One forward pass (a user backend's ``run``): the prefill."""
        return self.prefill(inputs, keys)

    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, keys: Any) -> dict[str, np.ndarray]:
        """One token per row, at its position, over the row's pages."""
        want, out = self._names(keys), {}
        for b in range(tokens.shape[0]):
            got = self._row(b, np.asarray(tokens[b:b + 1]), np.asarray(positions[b:b + 1]), want)
            self.slots[b].append(self.width)
            for name, value in got.items():
                out.setdefault(name, []).append(value[None])
        self.width += 1
        return {name: np.concatenate(parts) for name, parts in out.items()}

    def kv_cache(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each layer's cache in the logical layout ``[batch, length, kv_heads, head_dim]`` (padded
        positions 0: the engine holds none)."""
        rows = len(self.lengths)
        cache = {}
        for i in range(self.layers):
            k = np.zeros((rows, self.width, self.kv_heads, self.head_dim), np.float32)
            v = np.zeros_like(k)
            for b in range(rows):
                held_k, held_v = self._read(i, b, self.lengths[b])
                k[b, self.slots[b]] = held_k
                v[b, self.slots[b]] = held_v
            cache[i] = (k, v)
        return cache
