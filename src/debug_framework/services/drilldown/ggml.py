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
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...backends.capabilities import capabilities, count_windows_as, emulated_precision, offers, trace_nodes
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
    #: drills a layer at a decode step too: the engine, the reference and the calibration each
    #: decode the prompt and the steps before it through their own KV cache, then trace the layer
    decode_steps = True

    def applies(self, backend: Backend) -> tuple[bool, str]:
        if trace_nodes(backend) is None or not offers(backend, "emulated_precision"):
            return False, "drills an engine reporting its graph nodes (trace_nodes) and emulating its precision"
        return super().applies(backend)

    def calibration_trace(self, request: DrillRequest, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """The layer traced in the engine's emulated precision (at a decode step: through the
        emulation's own KV cache, the prompt and the steps before it decoded in it)."""
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
        with torch.no_grad():
            if request.step:
                trace = _trace_at_step(net, lambda x: torch.from_numpy(np.asarray(x, np.int64)), request,
                                       torch_namespace().from_host(hidden, net.dtype))
            else:
                net.positions = request.inputs.position_ids()
                trace = net.traced_layer(request.layer, torch_namespace().from_host(hidden, net.dtype),
                                         torch.from_numpy(np.asarray(request.inputs.attention_mask, np.int64)))
        return {name: float64_array(value) for name, value in trace.items()}

    def reference_trace(self, request: DrillRequest, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """The reference's values in float64; at a decode step through its own KV cache, its
        sliding windows counted as the engine counts them."""
        if not request.step:
            return super().reference_trace(request, hidden)
        from ...architectures import build_reference
        from ...architectures.decoder import count_windows_in
        from ...comparison import float64_array

        net = build_reference(request.model.config, request.model.weights, np.float64)
        count_windows_in(net, capabilities(request.backend).window_counts)
        return {name: float64_array(value) for name, value in _trace_at_step(net, np.asarray, request, hidden).items()}

    def engine_trace(self, request: DrillRequest, hidden: np.ndarray) -> list[tuple[str, object]]:
        """The engine's values; at a decode step through its own KV cache (``run_decode_layer_traced``)."""
        if not request.step:
            return super().engine_trace(request, hidden)
        assert request.tokens is not None
        return request.backend.run_decode_layer_traced(  # type: ignore[attr-defined, no-any-return]
            request.layer, hidden.astype(np.float32), request.inputs.copy(), request.step, request.tokens)

    def real_positions(self, request: DrillRequest) -> np.ndarray:
        """The prompt's tokens; at a decode step each row's one new token."""
        if not request.step:
            return super().real_positions(request)
        return np.ones((request.inputs.input_ids.shape[0], 1), bool)

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        if request.step and (request.tokens is None or not offers(request.backend, "run_decode_layer_traced")):
            from ...backends.drilldown.types import LayerDrilldown as Drilled

            return Drilled(layer=request.layer, checkpoint=request.checkpoint, backend=request.backend.name,
                           method=self.name, step=request.step,
                           note=f"not drilled at decode step {request.step}: the engine traces no decode step")
        entry = super().drill(request)
        entry.step = request.step
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

    def _repro(self, request: DrillRequest, entry: LayerDrilldown, node: str) -> None:
        """The culprit's standalone repro where one can be made (:mod:`.ggml_repro`), from the layer
        run once more in the engine (its traced values are not kept between runs); the note says
        which it is, or why there is none."""
        from ...comparison import float64_array
        from .ggml_repro import write_node_repro

        assert entry.culprit is not None
        row = next(r for r in entry.operators if r.op == entry.culprit.op)
        engine = {name: float64_array(value)
                  for name, value in self.engine_trace(request, np.asarray(request.hidden_in, np.float64))}
        try:
            folder, verified, why_not = write_node_repro(request, row, node, trace_nodes(request.backend) or {},
                                                         engine, self.real_positions(request))
        except OSError as exc:  # the table stands without it
            folder, verified, why_not = None, False, f"the repro could not be written: {exc}"
        note = entry.note.removesuffix(_TRACE_NO_REPRO)
        if folder is None:
            entry.note = f"{note}; {why_not}"
            return
        entry.culprit = dataclasses.replace(entry.culprit, repro_dir=str(folder), verified=verified)
        entry.note = (f"{note}; standalone repro of {node}: {folder} "
                      f"({'verified: it reproduces alone' if verified else 'written, but it does not reproduce alone'})")


def _trace_at_step(net: object, to_array: Callable[[np.ndarray], object], request: DrillRequest,
                   hidden: object) -> dict[str, object]:
    """Layer ``request.layer``'s named values at decode step ``request.step`` in the model ``net``:
    the prompt and the steps before it (``request.tokens``) decoded through its own KV cache, then the
    layer alone on ``hidden`` ``[B, 1, D]`` at the step's positions (``backends.decode.ReferenceDecoder``)."""
    from ...backends.decode import ReferenceDecoder, decode_positions

    offset = int(request.inputs.meta.get("position_offset", 0) or 0)
    tokens = np.asarray(request.tokens, np.int64)
    decoder = ReferenceDecoder(net, to_array)  # type: ignore[arg-type]
    try:
        decoder.prefill(request.inputs, [])
        for s in range(request.step - 1):
            decoder.decode_step(tokens[:, s], decode_positions(decoder.mask, offset)[:, 0], [])
        net.trace = {}  # type: ignore[attr-defined]
        decoder.layer_step(request.layer, hidden, decode_positions(decoder.mask, offset)[:, 0])
        return dict(net.trace)  # type: ignore[attr-defined]
    finally:
        net.trace = None  # type: ignore[attr-defined]
        decoder.close()
