"""The ``llamacpp`` engine's drill-down strategy, ``ggml``: the trace drill-down (:mod:`.trace`)
over llama.cpp's own graph nodes. It lives beside the trace strategy it specialises (the engine's
record names it; the engine's package sits in a lower layer than the drill-down services).

The failing layer runs in llama.cpp on the reference's input to it (its input node replaced as
llama.cpp computes it), every node of the layer read through the eval callback (``attn_norm-1``,
``Qcur-1``, ``Kcur-1``, ``Vcur-1``, ``kqv_out-1``, ``attn_out-1``, ``ffn_inp-1``, ``ffn_norm-1``,
``ffn_gate-1``, ``ffn_up-1``, ``ffn_swiglu-1``, ``ffn_out-1``, ``l_out-1``), queries and keys
put back in Hugging Face's rotary order for a Llama file, and judged in llama.cpp's order against
the reference's matching step in float64. Rows and culprit carry llama.cpp's node name (``node``)
beside the reference's operation (``op``: ``q``, ``ffn_gate`` ...). No standalone repro is written:
a ggml node runs inside llama.cpp's graph.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from .trace import TraceStrategy

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...backends.drilldown.types import DrillRequest, LayerDrilldown

__all__ = ["GgmlDrillStrategy"]


class GgmlDrillStrategy(TraceStrategy):
    """Drill a layer of the ``llamacpp`` backend node by node (see the module)."""

    name = "ggml"

    def applies(self, backend: Backend) -> tuple[bool, str]:
        if getattr(backend, "name", None) != "llamacpp":
            return False, "drills the llamacpp engine only"
        return super().applies(backend)

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        entry = super().drill(request)
        nodes: dict[str, str] = dict(getattr(request.backend, "trace_nodes", {}) or {})
        entry.method = self.name
        entry.operators = [dataclasses.replace(row, node=nodes.get(row.op, row.node)) for row in entry.operators]
        if entry.culprit is not None:
            node = nodes.get(entry.culprit.op, entry.culprit.node)
            entry.culprit = dataclasses.replace(
                entry.culprit, node=node,
                source=f"llama.cpp node {node}: {entry.culprit.source}" if entry.culprit.source else node)
        return entry

    def calibration_trace(self, request: DrillRequest, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """The layer traced in llama.cpp's emulated precision (:mod:`.precision`): the file's weight
        types, its activation quantization and KV cache type, so a correct quantized layer's nodes
        are within their bounds and the node a bug is in stands out."""
        import torch

        from ...architectures.xp import torch_namespace
        from ...comparison import float64_array

        emulation = request.backend.emulated_precision(request.model).trusted_backend()  # type: ignore[attr-defined]
        emulation.prepare(request.model, "float32")
        net = emulation.net
        net.positions = request.inputs.position_ids()
        with torch.no_grad():
            trace = net.traced_layer(request.layer, torch_namespace().from_host(hidden, net.dtype),
                                     torch.from_numpy(np.asarray(request.inputs.attention_mask, np.int64)))
        return {name: float64_array(value) for name, value in trace.items()}
