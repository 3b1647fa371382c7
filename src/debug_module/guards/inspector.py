"""GuardInspector: what Dynamo made of a model - graphs, graph breaks, guards, recompilations."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from debug_framework.jsonio import JsonObject

from ..constraints.base import op_name

__all__ = ["GuardInspector", "GuardReport", "GraphInfo", "GraphBreak", "GuardSet", "Recompilation"]


@dataclass
class GraphBreak:
    """Why Dynamo split the program, and the user's line that caused it."""

    reason: str
    file: str | None
    line: int | None
    code: str | None
    graph_index: int

    def __str__(self) -> str:
        return f"{self.reason} at {self.file}:{self.line}: {self.code}"


@dataclass
class GraphInfo:
    index: int
    call_index: int
    op_count: int
    ops: list[str]
    graph_break: GraphBreak | None = None


@dataclass
class GuardSet:
    """The guards Dynamo installed for one compiled frame (``code_name``) - Python-like expressions."""

    call_index: int
    code_name: str | None
    graph_indices: list[int]
    expressions: list[str]


@dataclass
class Recompilation:
    """A call whose inputs failed the guards of existing graphs, so ``code_name`` was recompiled."""

    call_index: int
    code_name: str
    reasons: list[str]


@dataclass
class GuardReport:
    calls: int
    graphs: list[GraphInfo] = field(default_factory=list)
    guard_sets: list[GuardSet] = field(default_factory=list)
    recompilations: list[Recompilation] = field(default_factory=list)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_breaks(self) -> list[GraphBreak]:
        return [g.graph_break for g in self.graphs if g.graph_break is not None]

    @property
    def graph_break_count(self) -> int:
        return len(self.graph_breaks)

    def to_dict(self) -> JsonObject:
        return {
            "calls": self.calls,
            "graph_count": self.graph_count,
            "graph_break_count": self.graph_break_count,
            "graphs": [asdict(g) for g in self.graphs],
            "graph_breaks": [asdict(b) for b in self.graph_breaks],
            "guard_sets": [asdict(s) for s in self.guard_sets],
            "recompilations": [asdict(r) for r in self.recompilations],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        lines = [f"{self.calls} call(s): {self.graph_count} graph(s), {self.graph_break_count} graph break(s), "
                 f"{len(self.recompilations)} recompilation(s)"]
        lines += [f"  break: {b}" for b in self.graph_breaks]
        lines += [f"  recompile (call {r.call_index}, {r.code_name}): {'; '.join(r.reasons)}" for r in self.recompilations]
        return "\n".join(lines)


class GuardInspector:
    """Compile ``model`` with Dynamo and record what happens across calls.

        inspector = GuardInspector(model)
        inspector(x)                   # positional and keyword inputs both work
        inspector(x_new_shape, mask=m)
        print(inspector.report().summary())

    Args:
        model: an ``nn.Module`` or function.
        backend: a torch.compile backend to hand each graph to after recording it (default: run
            the captured graph as is).
        dynamic: passed to Dynamo (``None``: automatic dynamic shapes after a recompile).
        reset: forget previously compiled frames first (process-wide Dynamo reset), so the report
            covers only this inspector's compilations.
    """

    def __init__(self, model: Callable[..., object], *, backend: Callable[..., object] | None = None,
                 dynamic: bool | None = None, reset: bool = True) -> None:
        from debug_framework._torch import dynamo

        self._dynamo = dynamo
        if reset:
            dynamo.reset()
        self.model = model
        self.backend = backend
        self._calls = 0
        self._graphs: list[GraphInfo] = []
        self._pending: list[int] = []
        self._guard_sets: list[GuardSet] = []
        self._recompiles: dict[tuple[int, str], Recompilation] = {}
        self._compiled = dynamo.optimize_with_hooks(
            model, self._record_graph, on_guards=self._record_guards, on_guard_fail=self._record_fail, dynamic=dynamic
        )

    # ------------------------------------------------------------------ hooks

    def _record_graph(self, gm: torch.fx.GraphModule, example_inputs: list[object]) -> Callable[..., object]:
        ops = [op_name(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        info = GraphInfo(index=len(self._graphs), call_index=self._calls, op_count=len(ops), ops=ops)
        found = self._dynamo.graph_break_reason(gm)
        if found is not None:
            reason, stack = found
            frame = stack[-1] if stack else None
            info.graph_break = GraphBreak(
                reason=reason,
                file=frame.filename if frame else None,
                line=frame.lineno if frame else None,
                code=(frame.line or "").strip() if frame else None,
                graph_index=info.index,
            )
        self._graphs.append(info)
        self._pending.append(info.index)
        if self.backend is not None:
            return self.backend(gm, example_inputs)
        return gm.forward

    def _record_guards(self, code_name: str | None, expressions: list[str]) -> None:
        self._guard_sets.append(GuardSet(self._calls, code_name, list(self._pending), list(expressions)))
        self._pending.clear()

    def _record_fail(self, reason: str, code_name: str) -> None:
        if self._calls == 0:
            return
        key = (self._calls, code_name)
        rec = self._recompiles.setdefault(key, Recompilation(self._calls, code_name, []))
        for part in self._dynamo.guard_fail_parts(reason):
            if part not in rec.reasons:
                rec.reasons.append(part)

    # ------------------------------------------------------------------ use

    def __call__(self, *args: object, **kwargs: object) -> object:
        try:
            return self._compiled(*args, **kwargs)
        finally:
            self._calls += 1

    def inspect(self, *args: object, **kwargs: object) -> GuardReport:
        """Call once with these inputs and return the report so far."""
        self(*args, **kwargs)
        return self.report()

    def report(self) -> GuardReport:
        # A guard failure counts as a recompilation only if that call compiled something.
        compiled_calls = {g.call_index for g in self._graphs}
        recompiles = [r for (call, _), r in sorted(self._recompiles.items(), key=lambda kv: kv[0])
                      if call in compiled_calls]
        return GuardReport(calls=self._calls, graphs=list(self._graphs), guard_sets=list(self._guard_sets),
                           recompilations=recompiles)
