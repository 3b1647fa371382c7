"""Decode-only bugs, as engines have them: each leaves the prefill right and goes wrong once tokens
are decoded through the KV cache. Used by tests/judgement (test_decode.py, test_decode_bugs.py) and
``benchmarks/bench_decode_diagnosis.py``.

Two kinds of buggy backend:

* a ``module_backend`` around the Hugging Face eager model with a patch (``patch(net)``), for the
  bugs that live in a framework's cache handling (RoPE offset, the cache's storage precision);
* a subclass of the example paged engine (``examples/paged_kv_engine.py``, a ``user_backend`` speaking
  the engine protocol), for the bugs of an engine's own cache bookkeeping (where a key is written,
  which keys a sliding window still holds, which position a decoded token gets).

:data:`DECODE_BUGS` names each bug with the tiny model family it needs, the session settings it
needs (left padding for the position bug) and where it must be found: the checkpoint and step of the
first divergence (``expected``) and the ``error_source`` kind.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from debug_framework.backends import module_backend, register_backend, user_backend
from debug_framework.backends.pytorch import build_hf_model

from benchmarks.injected_bugs import BUG_LAYER

_EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)
from paged_kv_engine import PagedLlamaEngine  # noqa: E402

__all__ = ["DECODE_BUGS", "DecodeBug", "register_decode_bug", "rope_at_zero_while_decoding", "kv_cache_in_bfloat16",
           "OffByOneWrite", "EvictsOneLate", "PaddedPositions"]


# -- bugs in a framework's cache handling (patches of the Hugging Face model) --------------------------
def rope_at_zero_while_decoding(net: torch.nn.Module) -> None:
    """Layer ``BUG_LAYER`` rotates a new token's query and key at position 0 once its cache holds
    earlier tokens (the cache offset forgotten): the prefill is untouched."""
    attn = net.model.layers[BUG_LAYER].self_attn

    def wrong_offset(_module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and cache.get_seq_length(attn.layer_idx) > 0:
            kwargs["position_embeddings"] = net.model.rotary_emb(kwargs["hidden_states"], kwargs["position_ids"] * 0)
        return args, kwargs

    attn.register_forward_pre_hook(wrong_offset, with_kwargs=True)


def kv_cache_in_bfloat16(net: torch.nn.Module) -> None:
    """The K/V cache stored at reduced precision (bfloat16) after every pass: the prefill's outputs
    are exact, every decode step reads the rounded cache."""

    def round_cache(_module, _args, out):
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        for layer in getattr(cache, "layers", []):
            for t in (layer.keys, layer.values):
                t.copy_(t.to(torch.bfloat16).to(t.dtype))

    net.register_forward_hook(round_cache)


# -- bugs in an engine's own cache bookkeeping (subclasses of the example paged engine) -----------------
class OffByOneWrite(PagedLlamaEngine):
    """A KV-cache write off by one while decoding: layer ``BUG_LAYER`` writes a new token's key
    and value over the previous slot's (the prefill writes right)."""

    def _write(self, layer: int, row: int, k: np.ndarray, v: np.ndarray) -> None:
        if layer == BUG_LAYER and k.shape[0] == 1 and self.lengths[row] > 0:
            self.lengths[row] -= 1
            super()._write(layer, row, k, v)
            self.lengths[row] += 1
            super()._write(layer, row, k, v)  # the slot the read expects, left as the pages held it
            return
        super()._write(layer, row, k, v)


class EvictsOneLate(PagedLlamaEngine):
    """Sliding-window eviction off by one while decoding: layer ``BUG_LAYER`` keeps the key that has
    just left the window (``window + 1`` keys seen); the prefill's window is right."""

    def _visible(self, layer: int, held: int, n: int) -> np.ndarray:
        seen = super()._visible(layer, held, n)
        window = self.net.config.sliding_window
        if layer == BUG_LAYER and n == 1 and window is not None and held >= window:
            seen[:, held - window] = True
        return seen


class PaddedPositions(PagedLlamaEngine):
    """Wrong positions under left padding while decoding: a decoded token is rotated at the batch's
    padded length (``position_offset`` + the width so far), not its row's token count, so a
    left-padded row's new tokens sit as many positions too far as the row has padding."""

    offset = 0

    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, keys: Any) -> dict[str, np.ndarray]:
        return super().decode_step(tokens, np.full_like(np.asarray(positions), self.offset + self.width), keys)

    def prefill(self, inputs: Any, keys: Any) -> dict[str, np.ndarray]:
        self.offset = int(inputs.meta.get("position_offset", 0) or 0)
        return super().prefill(inputs, keys)


@dataclass(frozen=True)
class DecodeBug:
    """One decode-only bug: how to build its backend, on which tiny family, with which settings, and
    where it must be found (``expected``: the first divergence's checkpoint id and step;
    ``source``: the ``error_source`` kind)."""

    family: str
    build: Callable[[str], str]
    expected: tuple[str, int]
    source: str
    config: dict[str, Any] = field(default_factory=dict)


def _module(patch: Callable[[torch.nn.Module], None]) -> Callable[[str], str]:
    def register(name: str) -> str:
        def build(model, dtype, device):
            net = build_hf_model(model, dtype, device)
            patch(net)
            return net

        register_backend(name, module_backend(name, build), replace=True)
        return name

    return register


def _engine(cls: type) -> Callable[[str], str]:
    def register(name: str) -> str:
        register_backend(name, user_backend(name, cls, dtypes=("float32",)), replace=True)
        return name

    return register


_LEFT = {"padding_side": "left", "pad_lengths": [0, 3], "position_offset": 2}

#: bug name -> the bug (its backend registers as ``decode_bug_<name>``)
DECODE_BUGS: dict[str, DecodeBug] = {
    "rope_wrong_position": DecodeBug("llama", _module(rope_at_zero_while_decoding),
                                     (f"post_attention:{BUG_LAYER}", 1), "decode"),
    "kv_write_off_by_one": DecodeBug("llama", _engine(OffByOneWrite), (f"post_attention:{BUG_LAYER}", 1), "decode"),
    "kv_cache_bfloat16": DecodeBug("llama", _module(kv_cache_in_bfloat16), ("post_attention:0", 1), "kv_cache"),
    "window_evicts_one_late": DecodeBug("mistral", _engine(EvictsOneLate), (f"post_attention:{BUG_LAYER}", 1),
                                        "decode", _LEFT),
    "left_padding_positions": DecodeBug("llama", _engine(PaddedPositions), ("post_attention:0", 1), "decode", _LEFT),
}


def register_decode_bug(bug: str) -> str:
    """Register the backend of ``bug`` (a key of :data:`DECODE_BUGS`); returns its name."""
    return DECODE_BUGS[bug].build(f"decode_bug_{bug}")
