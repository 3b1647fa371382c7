"""Peak live memory of an FX graph, estimated by liveness analysis over FakeTensor metadata."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx

from debug_framework.jsonio import JsonObject

from .base import TensorMeta, _flatten_tensors

__all__ = ["MemoryEstimate", "estimate_peak_memory"]


@dataclass
class MemoryEstimate:
    """``peak_bytes``: the most bytes alive at once while running the graph in node order.

    ``input_bytes`` (placeholders and ``get_attr`` parameters, each counted once) stay alive for the
    whole graph; ``peak_node`` is the node whose allocation reached the peak.
    """

    peak_bytes: int
    input_bytes: int
    peak_node: torch.fx.Node | None = None
    timeline: list[tuple[str, int]] = field(default_factory=list)

    def to_dict(self, *, with_timeline: bool = False) -> JsonObject:
        data: JsonObject = {
            "peak_bytes": self.peak_bytes,
            "input_bytes": self.input_bytes,
            "peak_node": self.peak_node.name if self.peak_node is not None else None,
        }
        if with_timeline:
            data["timeline"] = [list(x) for x in self.timeline]
        return data


def _bytes(val: object) -> int:
    return sum(TensorMeta(t).nbytes for t in _flatten_tensors(val))


def estimate_peak_memory(gm: torch.fx.GraphModule, *, keep_timeline: bool = False) -> MemoryEstimate:
    """Walk the graph in order: each non-view op allocates its outputs; an allocation is freed after
    the last node that reads it or any view of it; graph outputs and inputs are never freed.
    Multi-output ops allocate all outputs together (their ``getitem`` users alias them). The walk is
    the repro runtime's (``minifier/_runtime.liveness_peak``), so a standalone repro estimates alike."""
    from ..minifier._runtime import liveness_peak

    nodes = list(gm.graph.nodes)
    peak, input_bytes, index, timeline = liveness_peak(nodes, lambda n: _bytes(n.meta.get("val")))
    return MemoryEstimate(peak, input_bytes, nodes[index] if index is not None else None,
                          timeline if keep_timeline else [])
