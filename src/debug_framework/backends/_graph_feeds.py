"""What a graph of the model is fed, and the layer inputs among its outputs: shared by the graph
backends that export a torch model (:mod:`._graph_capture`) and those that run an ONNX file, so
the latter import no torch."""

from __future__ import annotations

from typing import Any

from ..capture.keys import CheckpointKey, layer_input_key
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel

__all__ = ["graph_inputs", "layer_inputs_from", "check_layer_index"]


def graph_inputs(model: LoadedModel, inputs: ModelInputs) -> dict[str, Any]:
    """The input arrays a graph takes: ids and mask, plus token types (zeros if absent) for BERT."""
    if getattr(model, "format", None) == "onnx":  # the file's own inputs, in its own integer types
        from ..modelio.onnx_file import onnx_feeds

        return onnx_feeds(model.config, inputs)
    out: dict[str, Any] = {"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask}
    if model.architecture == "bert":
        import numpy as np

        out["token_type_ids"] = inputs.token_type_ids if inputs.token_type_ids is not None else np.zeros_like(inputs.input_ids)
    return out


def layer_inputs_from(tensors: dict[CheckpointKey, Any], num_layers: int) -> dict[int, Any]:
    """Layer i's input is post_embedding (i = 0) or layer i-1's post_mlp, in both families."""
    out: dict[int, Any] = {}
    for i in range(num_layers):
        key = layer_input_key(i)
        if key in tensors:
            out[i] = tensors[key]
    return out


def check_layer_index(model: LoadedModel, i: int, backend: str) -> None:
    """Raises BackendInitializationError (DF002) when ``model`` has no layer ``i``."""
    if not 0 <= i < model.num_layers:
        from ..errors import BackendInitializationError

        raise BackendInitializationError(f"layer {i} does not exist (the model has {model.num_layers})", backend=backend)
