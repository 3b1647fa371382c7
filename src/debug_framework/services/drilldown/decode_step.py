"""A layer's call at a decode step, for the replay drill-down: the past its KV cache holds made
graph inputs.

At decode step ``s`` a layer's computation is not the prefill's: one new token attends over the
keys and values the cache holds from the passes before, at positions past the prompt. To drill it,
the alternative decodes through its own cache (the prefill and the steps before ``s``, teacher
forced with the session's tokens, :func:`~debug_framework.backends.decode.module_decode`) and step
``s``'s pass is stopped at the layer's first pre-hook, which keeps how the model calls it there:
the step's mask and position embeddings, and the cache object. The layer's entry in that cache is a
:class:`CacheSlot`: its keys and values become two more inputs of the traced graph
(``past.keys``, ``past.values``), reloaded before every call, so the cache's own update (the
concatenation, a sliding window's cut) is part of the graph, and the trusted side is given the
reference's past, as it is given the reference's hidden state.

Caches laid out as ``transformers`` lays them (``cache.layers[i].keys``/``.values``,
``[batch, kv_heads, length, head_dim]``) are known; another layout leaves the call without a slot,
and the drill-down says it cannot drill the step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from .layer_graph import LayerCall, _plain, _Stop

if TYPE_CHECKING:
    from ...modelio.inputs import ModelInputs

__all__ = ["CacheSlot", "capture_layer_call_at_step", "reference_past"]


@dataclass(frozen=True)
class CacheSlot:
    """Layer ``index``'s entry of a ``transformers`` KV cache as the layer found it at the step.

    ``keys``/``values`` ``[batch, kv_heads, length, head_dim]`` are what it held before the layer
    ran; ``state`` the entry's other attributes then (a sliding window's cumulative length), put
    back by :meth:`load` so every call of the layer starts from the same cache."""

    cache: object
    index: int
    keys: torch.Tensor
    values: torch.Tensor
    state: dict[str, object]

    @classmethod
    def find(cls, value: object, index: int) -> CacheSlot | None:
        """The slot of layer ``index`` in ``value`` when it is a cache of the known layout, else None."""
        layers = getattr(value, "layers", None)
        if not isinstance(layers, (list, tuple)) or not 0 <= index < len(layers):
            return None
        entry = layers[index]
        keys, values = getattr(entry, "keys", None), getattr(entry, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.dim() != 4:
            return None
        state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(entry).items()}
        return cls(value, index, keys.clone(), values.clone(), state)

    def load(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put the entry back as it was found, holding ``keys`` and ``values`` as its past."""
        entry = self.cache.layers[self.index]
        entry.__dict__.update(self.state)
        entry.keys, entry.values = keys, values

    def with_past(self, keys: torch.Tensor, values: torch.Tensor) -> CacheSlot:
        """The same slot with another past (the trusted side's)."""
        return replace(self, keys=keys, values=values)


def _normal(value: object) -> object:
    """``value`` with every tensor cloned outside inference mode (the decode runs in it; a traced
    call needs ordinary tensors)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_normal(v) for v in value)
    return value


class _Pass:
    """The capture :func:`module_decode` opens for one pass: a plain call, or at the drilled step one
    stopped at the layer's pre-hook (which keeps the call in ``seen``)."""

    def __init__(self, layer: torch.nn.Module | None, seen: dict[str, object]) -> None:
        self.layer, self.seen, self.tensors = layer, seen, {}

    def __enter__(self) -> _Pass:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, module: object, **kwargs: object) -> object:
        if self.layer is None:
            return module(**kwargs)

        def pre(_mod: torch.nn.Module, args: tuple[object, ...], kw: dict[str, object]) -> None:
            self.seen["args"], self.seen["kwargs"] = args, dict(kw)
            raise _Stop

        handle = self.layer.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
        try:
            with contextlib.suppress(_Stop):
                module(**kwargs)
        finally:
            handle.remove()
        return None


def capture_layer_call_at_step(module: torch.nn.Module, layer_name: str, layer: int, forward_kwargs: dict[str, object],
                               inputs: ModelInputs, step: int, tokens: np.ndarray, backend_name: str, dtype: str) -> LayerCall:
    """How ``module`` calls layer ``layer_name`` (index ``layer``) at decode ``step`` (>= 1): the
    prefill and steps ``1 .. step - 1`` through its own cache with ``tokens`` ``[batch, >= step]``,
    then step ``step``'s pass stopped at the layer. The call's ``cache`` is the layer's
    :class:`CacheSlot` (None: the model's cache has no layout this module knows).

    Raises:
        RuntimeError: the pass never called the layer.
    """
    from ...backends.decode import module_decode
    from ...capture.keys import Capture

    target = module.get_submodule(layer_name)
    seen: dict[str, object] = {}
    passes = iter(range(step + 1))
    module_decode(backend_name, module, forward_kwargs, lambda: _Pass(target if next(passes) == step else None, seen),
                  inputs, step, np.asarray(tokens, np.int64)[:, :step], dtype,
                  lambda _t, s: Capture(backend=backend_name, dtype=dtype, elapsed_s=s))
    if "args" not in seen:
        raise RuntimeError(f"decode step {step}'s pass never called {layer_name!r}")
    slot = next((found for v in [*seen["args"], *seen["kwargs"].values()]
                 if (found := CacheSlot.find(v, layer)) is not None), None)
    keep = None if slot is None else slot.cache

    def plain(value: object) -> object:
        return value if keep is not None and value is keep else _normal(_plain(value))

    args = tuple(plain(v) for v in seen["args"])
    kwargs = {k: plain(v) for k, v in seen["kwargs"].items()}
    if slot is not None:
        slot.load(slot.keys, slot.values)  # the entry's own tensors as ordinary ones
    if args:
        return LayerCall(args[0], tuple(args[1:]), kwargs, False, slot)
    hidden = kwargs.pop("hidden_states")
    return LayerCall(hidden, (), kwargs, True, slot)


def reference_past(past: tuple[object, object] | None,
                   slot: CacheSlot) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, str]:
    """The reference's keys and values of the layer before the step (``[batch, length, kv_heads,
    head_dim]``, as :class:`~debug_framework.backends.decode.DecodeRun` keeps them) laid out as the
    slot holds them, in float64, cut to the trailing positions the slot holds (a sliding window
    keeps only the last ones); ``(None, why)`` when the reference kept none or their shapes differ."""
    if past is None:
        return None, "the reference backend does not expose its KV cache"
    out = []
    for part, own in zip(past, (slot.keys, slot.values)):
        t = torch.as_tensor(np.asarray(part.detach().cpu() if isinstance(part, torch.Tensor) else part),
                            dtype=torch.float64).transpose(1, 2)
        length = own.shape[2]
        if t.dim() != 4 or t.shape[2] < length:
            return None, (f"the reference's cache {list(t.shape)} does not hold the {length} position(s) the "
                          f"alternative's {list(own.shape)} does")
        t = t[:, :, t.shape[2] - length:]
        if t.shape != own.shape:
            return None, f"the reference's cache {list(t.shape)} is not laid out as the alternative's {list(own.shape)}"
        out.append(t.contiguous())
    return (out[0], out[1]), ""
