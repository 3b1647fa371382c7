"""The checkpoint walk every reference model shares, whatever array library it is written in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Key = tuple[str, int | None]

__all__ = ["walk_checkpoints"]


def walk_checkpoints(
    h: Any,
    num_layers: int,
    layer: Callable[[int, Any], tuple[Any, Any]],
    head: Callable[[Any], Any] | None,
    want: set[Key] | None,
    layer_inputs: dict[int, Any] | None,
) -> dict[Key, Any]:
    """Run the layers from the embedding output ``h`` and keep the checkpoints in ``want`` (all
    when ``None``): ``post_embedding``, per layer ``post_attention`` and ``post_mlp`` (``layer(i, h)``
    returns both), then ``post_processing`` = ``head(h)`` (``h`` itself when ``head`` is ``None``),
    computed only when wanted. Each layer's input goes into ``layer_inputs`` when it is a dict."""
    out: dict[Key, Any] = {}

    def keep(name: str, index: int | None, x: Any) -> None:
        if want is None or (name, index) in want:
            out[(name, index)] = x

    keep("post_embedding", None, h)
    for i in range(num_layers):
        if layer_inputs is not None:
            layer_inputs[i] = h
        a, h = layer(i, h)
        keep("post_attention", i, a)
        keep("post_mlp", i, h)
    if want is None or ("post_processing", None) in want:
        out[("post_processing", None)] = h if head is None else head(h)
    return out
