"""Graph statistics (op counts by ATen name, dtypes, estimated peak memory) and optional SVG."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
import torch.fx

from debug_framework.jsonio import JsonObject

from .constraints.base import _flatten_tensors, op_name
from .constraints.memory import estimate_peak_memory

__all__ = ["graph_statistics", "graph_svg"]

log = logging.getLogger(__name__)


def graph_statistics(gm: torch.fx.GraphModule) -> JsonObject:
    """JSON-ready statistics of one FX graph."""
    ops: Counter[str] = Counter()
    dtypes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    symbolic = False
    for n in gm.graph.nodes:
        kinds[n.op] += 1
        if n.op == "call_function":
            ops[op_name(n.target)] += 1
        for t in _flatten_tensors(n.meta.get("val")):
            dtypes[str(t.dtype).removeprefix("torch.")] += 1
            if not symbolic and any(not isinstance(d, int) for d in t.shape):
                symbolic = True
    mem = estimate_peak_memory(gm) if any("val" in n.meta for n in gm.graph.nodes) else None
    return {
        "nodes": sum(kinds.values()),
        "node_kinds": dict(kinds),
        "op_counts": dict(ops.most_common()),
        "dtypes": dict(dtypes.most_common()),
        "symbolic_shapes": symbolic,
        "memory": mem.to_dict() if mem is not None else None,
    }


def graph_svg(gm: torch.fx.GraphModule, name: str, path: Path) -> str | None:
    """Write an SVG of ``gm`` to ``path``; returns why not when pydot/graphviz is unavailable."""
    try:
        from torch.fx.passes.graph_drawer import FxGraphDrawer

        drawer = FxGraphDrawer(gm, name)
        path.write_bytes(drawer.get_dot_graph().create_svg())
        return None
    except Exception as e:  # ImportError (pydot) or graphviz 'dot' missing
        return f"{type(e).__name__}: {e}"
