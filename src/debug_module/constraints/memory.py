"""Peak live memory of an FX graph, estimated by liveness analysis over FakeTensor metadata."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

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

    def to_dict(self, *, with_timeline: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "peak_bytes": self.peak_bytes,
            "input_bytes": self.input_bytes,
            "peak_node": self.peak_node.name if self.peak_node is not None else None,
        }
        if with_timeline:
            data["timeline"] = [list(x) for x in self.timeline]
        return data


def _bytes(val: Any) -> int:
    return sum(TensorMeta(t).nbytes for t in _flatten_tensors(val))


def estimate_peak_memory(gm: torch.fx.GraphModule, *, keep_timeline: bool = False) -> MemoryEstimate:
    """Walk the graph in order: each non-view op allocates its outputs; an allocation is freed after
    the last node that reads it or any view of it; graph outputs and inputs are never freed.
    Multi-output ops allocate all outputs together (their ``getitem`` users alias them)."""
    nodes = list(gm.graph.nodes)
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    size: dict[torch.fx.Node, int] = {}
    last_use: dict[torch.fx.Node, int] = {}
    persistent: set[torch.fx.Node] = set()
    seen_params: set[str] = set()
    input_bytes = 0

    for i, n in enumerate(nodes):
        if n.op in ("placeholder", "get_attr"):
            root[n] = n
            b = _bytes(n.meta.get("val"))
            if n.op == "get_attr" and n.target in seen_params:
                b = 0
            seen_params.add(str(n.target))
            size[n] = b
            input_bytes += b
            persistent.add(n)
            continue
        if n.op == "output":
            for a in n.all_input_nodes:
                persistent.add(root.get(a, a))
            continue
        first_tensor_arg = next((a for a in n.all_input_nodes if a in root), None)
        if n.target is operator.getitem and first_tensor_arg is not None:
            root[n] = root[first_tensor_arg]
        elif getattr(n.target, "is_view", False) and first_tensor_arg is not None:
            root[n] = root[first_tensor_arg]
        else:
            root[n] = n
            size[n] = _bytes(n.meta.get("val"))
        for a in n.all_input_nodes:
            if a in root:
                last_use[root[a]] = i

    live = input_bytes
    peak, peak_node = live, None
    timeline: list[tuple[str, int]] = []
    frees: dict[int, list[torch.fx.Node]] = {}
    for r, i in last_use.items():
        frees.setdefault(i, []).append(r)
    for i, n in enumerate(nodes):
        if n.op in ("call_function", "call_method", "call_module") and root.get(n) is n:
            live += size[n]
            if live > peak:
                peak, peak_node = live, n
            if n not in last_use and n not in persistent:  # dead value: freed at once
                live -= size[n]
        for r in frees.get(i, ()):
            if r not in persistent and root.get(r) is r and r.op not in ("placeholder", "get_attr"):
                live -= size[r]
        if keep_timeline:
            timeline.append((n.name, live))
    return MemoryEstimate(peak, input_bytes, peak_node, timeline)
