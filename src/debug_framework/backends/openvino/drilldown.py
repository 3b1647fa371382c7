"""The ``openvino`` engine's drill-down strategy: the ONNX-graph engines' node-level drill-down
(:mod:`debug_framework.backends.drilldown.onnx`) with OpenVINO as the runtime.

The layer is exported alone by the backend (:meth:`OpenVinoBackend.export_layer`, every ONNX-graph
engine's), every node output marked; the trusted run is the same graph in float64 under
``onnx.reference``; each node is replayed alone as a one-node model compiled by OpenVINO with the
backend's device and precision hint (its bfloat16 rounding included, see :mod:`.runner`) and judged
against its bound. The culprit gets no standalone repro (the node alone is in the layer's graph
file), and the note says so.
"""

from __future__ import annotations

from ..drilldown.onnx import OnnxNodeStrategy
from ..drilldown.types import DrillRequest, LayerDrilldown

__all__ = ["OpenVinoDrillStrategy"]

_NO_REPRO = ("no standalone repro for the culprit: the ONNX node repro runs another runtime, not OpenVINO "
             "(the node alone is in the layer's graph file)")


class OpenVinoDrillStrategy(OnnxNodeStrategy):
    """Drill layers of the ``openvino`` backend node by node (see the module's docstring)."""

    name = "openvino"
    backend_name, label = "openvino", "OpenVINO"

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        """The node-level drill-down, its note saying the culprit has no standalone repro."""
        drill = super().drill(request)
        if drill.culprit is not None:
            drill.note = "; ".join(n for n in (drill.note, _NO_REPRO) if n)
        return drill
