"""The ``openvino`` drill-down strategy: the ``onnx`` strategy's method with OpenVINO as the runtime.

The layer is exported alone by the backend (:meth:`OpenVinoBackend.export_layer`, the
``onnxruntime`` backend's), every node output marked; the trusted run is the same graph in float64
under ``onnx.reference``; each node is replayed alone as a one-node model compiled by OpenVINO with
the backend's device and precision hint (its bfloat16 rounding included, see
:mod:`debug_framework.backends.openvino_backend`) and judged against its bound. The culprit gets no
standalone repro: the ONNX node repro runs ONNX Runtime, which is not what computed the value, and
the note says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .onnx import OnnxDrillStrategy
from .types import Culprit, DrillRequest, LayerDrilldown, OperatorRow

__all__ = ["OpenVinoDrillStrategy"]

_NO_REPRO = ("no standalone repro for the culprit: the ONNX node repro runs ONNX Runtime, not OpenVINO "
             "(the node alone is in the layer's graph file)")


class OpenVinoDrillStrategy(OnnxDrillStrategy):
    """Drill layers of the ``openvino`` backend node by node (see the module's docstring)."""

    name = "openvino"
    backend_name, method, label = "openvino", "export_layer", "OpenVINO"

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        drill = super().drill(request)
        drill.method = self.name
        if drill.culprit is not None:
            drill.note = "; ".join(n for n in (drill.note, _NO_REPRO) if n)
        return drill

    @staticmethod
    def _culprit(row: OperatorRow, replay: tuple[Any, Any, str], values: Any, backend: Any, out: Path) -> Culprit:
        return Culprit(op=row.op, node=row.node, module_path=row.module_path, source=row.source)
