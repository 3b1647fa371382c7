"""The session interface of the engines that run ONNX graphs: what the shared ONNX-graph code
(:mod:`._onnx_export`, :mod:`._onnx_file`), the node-level drill-down and the reference runners ask
of a session, whatever engine opened it; and the record of one layer exported alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..capture.keys import CheckpointKey

__all__ = ["GraphPort", "GraphSession", "LayerExport"]


class GraphPort(Protocol):
    """A graph input or output as a session describes it: its name and its type (``tensor(float)``)."""

    name: str
    type: str


class GraphSession(Protocol):
    """What the ONNX-graph engines, the drill-down and the reference runners ask of a session on an
    ONNX graph (ONNX Runtime's ``InferenceSession`` interface; an engine adapts its own to it)."""

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def get_inputs(self) -> list[GraphPort]: ...

    def get_outputs(self) -> list[GraphPort]: ...

    def get_providers(self) -> list[str]: ...


@dataclass
class LayerExport:
    """One layer exported alone (:meth:`OnnxGraphBackend.export_layer`): the file, the layer's module name,
    its checkpoints (the graph's outputs, in order), which graph input is the hidden state, and the arrays
    to feed (float32, as the model passes them; feed only the graph's own inputs: the exporter drops unused ones)."""

    path: Path
    layer_name: str
    keys: list[CheckpointKey]
    hidden_input: str
    feeds: dict[str, np.ndarray]
    reference_path: Path | None = None  #: with a model_file: the layer cut out of the session's own file
