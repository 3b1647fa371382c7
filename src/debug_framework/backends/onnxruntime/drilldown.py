"""The ``onnxruntime`` engine's drill-down strategy, ``onnx``: the ONNX-graph engines' node-level
drill-down (:mod:`debug_framework.backends.drilldown.onnx`) run in ONNX Runtime, the culprit's
repro directory (:mod:`.repro`, one node in ONNX Runtime with the backend's optimisation level and
providers) written and verified once in a fresh process to set ``verified``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...repro_format import verify
from ..drilldown.onnx import NodeReplay, OnnxNodeStrategy
from ..drilldown.types import Culprit, OperatorRow
from .repro import write_onnx_repro
from .runner import OPTIMIZATION_LEVELS

if TYPE_CHECKING:
    from ..drilldown.onnx import _Values
    from .runner import OnnxRuntimeBackend

__all__ = ["OnnxDrillStrategy"]


class OnnxDrillStrategy(OnnxNodeStrategy):
    """Drill layers of the ``onnxruntime`` backend node by node, with a verified repro of the culprit."""

    name = "onnx"
    backend_name, label = "onnxruntime", "ONNX Runtime"

    def _culprit(self, row: OperatorRow, replay: NodeReplay, values: _Values, backend: OnnxRuntimeBackend,
                 out: Path) -> Culprit:
        """The culprit with its repro directory: the node alone, in ONNX Runtime as the backend runs it."""
        single, feeds, output = replay
        session = backend.open_session(single.SerializeToString(), out)
        directory = write_onnx_repro(out, node=row.node, op=row.op, model=single, feeds=feeds, output=output,
                                     expected=values.trusted[output], bound=row.bound,
                                     optimization=OPTIMIZATION_LEVELS[backend.optimization],
                                     providers=list(session.get_providers()), graph_transform=backend.graph_transform)
        return Culprit(op=row.op, node=row.node, module_path=row.module_path, source=row.source,
                       repro_dir=str(directory), verified=verify(directory).reproduced)
