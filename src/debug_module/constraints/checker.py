"""Run a set of constraints over one ATen graph: every violation plus a coverage report."""

from __future__ import annotations

import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch.fx

from debug_framework.jsonio import JsonObject

from .base import Constraint, NodeInfo, Violation, iter_checked_nodes
from .builtin import as_constraint

__all__ = ["Coverage", "GraphReport", "check_graph", "compute_coverage"]


@dataclass
class Coverage:
    """How much of one graph the accelerator could run.

    ``nodes``/``supported_nodes`` count compute nodes (``call_function`` except ``getitem``); an op
    is supported when none of its nodes violates a node-level constraint; ``fallback_ops`` maps each
    op that would fall back to its number of violating nodes; ``partitions`` is the number of
    connected regions the supported nodes form (what a capability-based partitioner would hand
    the accelerator as separate subgraphs).
    """

    nodes: int
    supported_nodes: int
    ops: int
    supported_ops: int
    fallback_ops: dict[str, int]
    partitions: int

    @property
    def node_share(self) -> float:
        return self.supported_nodes / self.nodes if self.nodes else 1.0

    @property
    def op_share(self) -> float:
        return self.supported_ops / self.ops if self.ops else 1.0

    def to_dict(self) -> JsonObject:
        return {
            "nodes": self.nodes,
            "supported_nodes": self.supported_nodes,
            "node_share": round(self.node_share, 6),
            "ops": self.ops,
            "supported_ops": self.supported_ops,
            "op_share": round(self.op_share, 6),
            "fallback_ops": dict(sorted(self.fallback_ops.items())),
            "partitions": self.partitions,
        }


@dataclass
class GraphReport:
    """Result of checking one graph. JSON form via :meth:`to_dict`."""

    graph: str
    violations: list[Violation]
    coverage: Coverage
    constraints: list[JsonObject] = field(default_factory=list)
    check_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> JsonObject:
        return {
            "graph": self.graph,
            "ok": self.ok,
            "violation_count": len(self.violations),
            "violations": [v.to_dict() for v in self.violations],
            "coverage": self.coverage.to_dict(),
            "constraints": self.constraints,
            "check_seconds": self.check_seconds,
        }

    def summary(self) -> str:
        c = self.coverage
        text = (f"{self.graph}: {len(self.violations)} violation(s); {c.supported_nodes}/{c.nodes} nodes "
                f"({c.node_share:.1%}) and {c.supported_ops}/{c.ops} ops supported; {c.partitions} partition(s)")
        if c.fallback_ops:
            text += "; fallback ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(c.fallback_ops.items()))
        return text


def _is_compute(info: NodeInfo) -> bool:
    return info.node.op == "call_function"


def compute_coverage(infos: Sequence[NodeInfo], bad_nodes: set[torch.fx.Node]) -> Coverage:
    compute = [i for i in infos if _is_compute(i)]
    ops = Counter(i.op for i in compute)
    fallback = Counter(i.op for i in compute if i.node in bad_nodes)
    supported = [i.node for i in compute if i.node not in bad_nodes]
    # Union-find over edges between supported compute nodes (getitem users glue to their producer).
    parent: dict[torch.fx.Node, torch.fx.Node] = {n: n for n in supported}

    def find(n: torch.fx.Node) -> torch.fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def producer(a: torch.fx.Node) -> torch.fx.Node:
        while a.op == "call_function" and a.target is operator.getitem:
            a = a.args[0]  # type: ignore[assignment]
        return a

    for n in supported:
        for a in n.all_input_nodes:
            a = producer(a)
            if a in parent:
                ra, rn = find(a), find(n)
                if ra is not rn:
                    parent[ra] = rn
    partitions = len({find(n) for n in supported})
    return Coverage(
        nodes=len(compute),
        supported_nodes=len(supported),
        ops=len(ops),
        supported_ops=len([op for op in ops if op not in fallback]),
        fallback_ops=dict(fallback),
        partitions=partitions,
    )


def check_graph(
    gm: torch.fx.GraphModule,
    constraints: Iterable[Constraint | Callable[[NodeInfo], object]],
    graph_name: str = "graph",
) -> GraphReport:
    """Check ``gm`` (an ATen graph with ``node.meta["val"]``) against every constraint.

    Never stops at the first violation. An empty constraint list yields no violations.
    """
    start = time.perf_counter()
    cons = [as_constraint(c) for c in constraints]
    node_cons = [c for c in cons if c.node_level]
    infos = list(iter_checked_nodes(gm, graph_name))
    violations: list[Violation] = []
    bad_nodes: set[torch.fx.Node] = set()
    for info in infos:
        for c in node_cons:
            found = c.check_node(info)
            if found:
                violations.extend(found)
                bad_nodes.add(info.node)
    for c in cons:
        violations.extend(c.check_graph(gm, infos, graph_name))
    coverage = compute_coverage(infos, bad_nodes)
    return GraphReport(
        graph=graph_name,
        violations=violations,
        coverage=coverage,
        constraints=[c.describe() for c in cons],
        check_seconds=time.perf_counter() - start,
    )
