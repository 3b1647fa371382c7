"""The ``ggml`` drill-down strategy: the trace drill-down (:mod:`.trace`) over an engine's own graph
nodes, named as the engine names them (llama.cpp's ``Qcur-1``, ``ffn_gate-0``), for an engine whose
precision is more than a dtype.

It applies to a backend that reports, beside its traced values (``run_layer_traced``), the node each
came from (``trace_nodes``: trace name -> node) and that emulates its precision
(``emulated_precision(model)``): the failing layer runs in the engine on the reference's input to it,
each node is judged in the engine's order against the reference's matching step in float64, with
the calibration traced in the engine's emulated precision (for llama.cpp: the file's weight types,
its activation quantization and KV cache type), so a correct quantized layer's nodes are within
their bounds and the node a bug is in stands out. Rows and culprit carry the engine's node name
(``node``) beside the reference's step (``op``: ``q``, ``ffn_gate`` ...). A culprit that is one
projection (``Qcur-1``, ``ffn_gate-0`` ...) gets a standalone repro (:mod:`.ggml_repro`: the node's
input and output as llama.cpp computed them, the model's weight, the reference's product beside
them), verified once; any other node runs among several inside the engine's graph and gets none.
The engine's record names this strategy.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from ...backends.capabilities import count_windows_as, emulated_precision, offers, trace_nodes
from .trace import TraceStrategy

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...backends.drilldown.types import DrillRequest, LayerDrilldown

__all__ = ["GgmlDrillStrategy"]

#: what the trace drill-down's note ends with (it writes no repro), replaced by what this one wrote
_TRACE_NO_REPRO = "; no standalone repro (the engine's steps run inside it)"


class GgmlDrillStrategy(TraceStrategy):
    """Drill a layer of an engine that names its graph nodes node by node (see the module)."""

    name = "ggml"

    def applies(self, backend: Backend) -> tuple[bool, str]:
        if trace_nodes(backend) is None or not offers(backend, "emulated_precision"):
            return False, "drills an engine reporting its graph nodes (trace_nodes) and emulating its precision"
        return super().applies(backend)

    def calibration_trace(self, request: DrillRequest, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """The layer traced in the engine's emulated precision."""
        import torch

        from ...architectures.xp import torch_namespace
        from ...comparison import float64_array

        precision = emulated_precision(request.backend, request.model)
        if precision is None:
            return super().calibration_trace(request, hidden)
        emulation = precision.trusted_backend()
        emulation.prepare(request.model, precision.dtype)
        count_windows_as(emulation, request.backend)
        net = emulation.net  # type: ignore[attr-defined]
        net.positions = request.inputs.position_ids()
        with torch.no_grad():
            trace = net.traced_layer(request.layer, torch_namespace().from_host(hidden, net.dtype),
                                     torch.from_numpy(np.asarray(request.inputs.attention_mask, np.int64)))
        return {name: float64_array(value) for name, value in trace.items()}

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        entry = super().drill(request)
        nodes = trace_nodes(request.backend) or {}
        entry.method = self.name
        entry.operators = [dataclasses.replace(row, node=nodes.get(row.op, row.node)) for row in entry.operators]
        if entry.culprit is not None:
            node = nodes.get(entry.culprit.op, entry.culprit.node)
            entry.culprit = dataclasses.replace(
                entry.culprit, node=node,
                source=f"node {node}: {entry.culprit.source}" if entry.culprit.source else node)
            self._repro(request, entry, node)
        return entry

    @staticmethod
    def _repro(request: DrillRequest, entry: LayerDrilldown, node: str) -> None:
        """The culprit's standalone repro where one can be made (:mod:`.ggml_repro`), from the layer
        run once more in the engine (its traced values are not kept between runs); the note says
        which it is, or why there is none."""
        from ...comparison import float64_array
        from .ggml_repro import write_node_repro

        assert entry.culprit is not None
        row = next(r for r in entry.operators if r.op == entry.culprit.op)
        h = np.asarray(request.hidden_in, np.float64)
        engine = {name: float64_array(value) for name, value in request.backend.run_layer_traced(  # type: ignore[attr-defined]
            request.layer, h.astype(np.float32) if request.dtype != "float64" else h.copy(), request.inputs.copy())}
        try:
            folder, verified, why_not = write_node_repro(request, row, node, trace_nodes(request.backend) or {}, engine)
        except OSError as exc:  # the table stands without it
            folder, verified, why_not = None, False, f"the repro could not be written: {exc}"
        note = entry.note.removesuffix(_TRACE_NO_REPRO)
        if folder is None:
            entry.note = f"{note}; {why_not}"
            return
        entry.culprit = dataclasses.replace(entry.culprit, repro_dir=str(folder), verified=verified)
        entry.note = (f"{note}; standalone repro of {node}: {folder} "
                      f"({'verified: it reproduces alone' if verified else 'written, but it does not reproduce alone'})")
