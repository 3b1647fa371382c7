"""A layer of a torch model exported alone (an ONNX-graph engine's ``layer_replay="export"`` and its
drill-down export): the layer's call arguments flattened to tensors and rebuilt inside the exported
module. Imported only where a torch model is exported (an ONNX file's path never needs torch)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LayerReplay", "flatten", "unflatten"]


class LayerReplay(torch.nn.Module):
    """One layer called with the arguments rebuilt from flat tensors (``spec``: see :func:`flatten`);
    returns what the checkpoint hooks inside it appended to ``sink``, in firing order."""

    def __init__(self, layer: torch.nn.Module, sink: list[torch.Tensor], spec: Any) -> None:
        super().__init__()
        self.layer = layer
        self._sink = sink
        self._spec = spec

    def forward(self, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = unflatten(self._spec, list(leaves))
        self._sink.clear()
        self.layer(*args, **kwargs)
        out = tuple(self._sink)
        self._sink.clear()
        return out


_LEAF = object()


def flatten(value: Any) -> tuple[list[torch.Tensor], Any]:
    """The tensors in nested tuples/lists/dicts, in order, and a spec of everything else."""
    leaves: list[torch.Tensor] = []

    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            leaves.append(v)
            return _LEAF
        if isinstance(v, (tuple, list)):
            return (type(v), [walk(x) for x in v])
        if isinstance(v, dict):
            return (dict, {k: walk(x) for k, x in v.items()})
        return ("const", v)

    return leaves, walk(value)


def unflatten(spec: Any, leaves: list[torch.Tensor]) -> Any:
    """The value :func:`flatten` took apart, from its ``spec`` and (new) ``leaves``."""
    it = iter(leaves)

    def build(sp: Any) -> Any:
        if sp is _LEAF:
            return next(it)
        kind, body = sp
        if kind == "const":
            return body
        if kind is dict:
            return {k: build(x) for k, x in body.items()}
        return kind(build(x) for x in body)

    return build(spec)
