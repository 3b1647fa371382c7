"""Cutting an FX graph down to a subset of its nodes.

The unit of reduction is a *group*: one compute node plus the ``getitem`` nodes that unpack its
tuple result (they are kept or dropped together, so no tuple ever has to become a graph input).
A candidate is a set of group indices; :meth:`GraphSlicer.build` turns it into a runnable
``GraphModule``:

- a kept node whose producer was dropped reads a new placeholder of the producer's name, fed with
  the producer's *recorded* value (from one eager run of the original graph);
- original inputs and parameters (``get_attr``) are kept only where a kept node uses them;
- the outputs are the kept nodes no other kept node uses (the sinks), so nothing kept is dead.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from . import _runtime

__all__ = ["GraphSlicer", "Candidate", "record_values", "synthesize_value"]

_COMPUTE = ("call_function", "call_method", "call_module")


def _is_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def synthesize_value(val: object, *, seed: int = 0) -> object:
    """A real value shaped like ``val`` (a FakeTensor or tensor in ``node.meta["val"]``): random normal
    floats, zeros for integers and bools. Used only when a graph cannot be run with real inputs."""
    if isinstance(val, torch.Tensor):
        from ..constraints.base import concrete_dim

        shape = [concrete_dim(d) or 1 for d in val.shape]
        stride = [concrete_dim(s) or 0 for s in val.stride()]
        span = max(1, _storage_span(shape, stride))
        g = torch.Generator().manual_seed(seed)
        if val.dtype.is_floating_point or val.dtype.is_complex:
            base = torch.randn(span, generator=g, dtype=torch.float64).to(val.dtype)
        else:
            base = torch.zeros(span, dtype=val.dtype)
        return torch.as_strided(base, shape, stride)
    if isinstance(val, (list, tuple)):
        return type(val)(synthesize_value(v, seed=seed + i) for i, v in enumerate(val))
    if isinstance(val, torch.SymInt):
        from ..constraints.base import concrete_dim

        return concrete_dim(val)
    return val


def _storage_span(shape: Sequence[int], stride: Sequence[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((d - 1) * st for d, st in zip(shape, stride))


def record_values(gm: torch.fx.GraphModule, inputs: Sequence[object] | None) -> dict[str, object]:
    """Every node's value (by node name) from one eager run of ``gm``; falls back to values synthesised
    from ``node.meta["val"]`` for the whole graph when it cannot run (no inputs, fake-only graph)."""
    values: dict[str, object] = {}
    if inputs is not None:

        class _Recorder(torch.fx.Interpreter):
            def run_node(self, n: torch.fx.Node) -> object:
                r = super().run_node(n)
                # a snapshot: an in-place op later in the graph must not change what this node produced
                values[n.name] = _runtime.fresh([r])[0] if isinstance(r, torch.Tensor) else r
                return r

        try:
            with torch.no_grad():
                _Recorder(gm).run(*_runtime.fresh(inputs))  # the caller's inputs stay as they are
            return values
        except Exception:
            values.clear()
    for i, n in enumerate(gm.graph.nodes):
        if n.op == "output":
            continue
        if n.op == "get_attr":
            values[n.name] = _fetch_attr(gm, n.target)
        elif "val" in n.meta:
            values[n.name] = synthesize_value(n.meta["val"], seed=i)
    return values


def _fetch_attr(gm: torch.nn.Module, target: str) -> object:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Candidate:
    """A built sub-graph: the module, its inputs (values, in placeholder order) and a content key."""

    gm: torch.fx.GraphModule
    inputs: list[object]
    key: str
    groups: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.groups)


class GraphSlicer:
    """Builds sub-graphs of ``gm`` from sets of group indices (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, values: dict[str, object]) -> None:
        self.gm = gm
        self.values = values
        self.groups: list[list[torch.fx.Node]] = []
        index: dict[torch.fx.Node, int] = {}
        for n in gm.graph.nodes:
            if n.op not in _COMPUTE:
                continue
            if _is_getitem(n) and isinstance(n.args[0], torch.fx.Node) and n.args[0] in index:
                index[n] = index[n.args[0]]
                self.groups[index[n]].append(n)
                continue
            index[n] = len(self.groups)
            self.groups.append([n])
        self.group_of = index

    def __len__(self) -> int:
        return len(self.groups)

    def describe_group(self, i: int) -> str:
        head = self.groups[i][0]
        return f"{head.name} = {_target_name(head)}"

    def key(self, groups: Iterable[int]) -> str:
        return hashlib.sha1(",".join(map(str, sorted(set(groups)))).encode()).hexdigest()[:16]

    def build(self, groups: Iterable[int]) -> Candidate:
        keep = sorted(set(groups))
        if not keep:
            raise ValueError("a candidate needs at least one node")
        kept_nodes = {n for g in keep for n in self.groups[g]}
        new = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        inputs: list[object] = []
        root = torch.nn.Module()
        used_attrs: dict[str, torch.fx.Node] = {}

        # Placeholders first, in the original order (original inputs), then the cut producers.
        needed: list[torch.fx.Node] = []
        seen: set[torch.fx.Node] = set()
        for n in self.gm.graph.nodes:
            if n in kept_nodes:
                for a in n.all_input_nodes:
                    if a not in kept_nodes and a not in seen:
                        seen.add(a)
                        needed.append(a)
        order = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        needed.sort(key=lambda a: (a.op != "placeholder", order[a]))
        for a in needed:
            if a.op == "get_attr":
                attr = _fetch_attr(self.gm, a.target)
                _set_attr(root, a.target, attr)
                env[a] = new.get_attr(a.target)
                env[a].meta = dict(a.meta)
                used_attrs[a.target] = env[a]
                continue
            value = self.values.get(a.name)
            if a.op != "placeholder" and not isinstance(value, torch.Tensor):
                continue  # non-tensor producer (an int, a None): inlined as a constant below
            p = new.placeholder(a.name)
            p.meta = dict(a.meta)
            env[a] = p
            inputs.append(value)

        def map_arg(x: torch.fx.Node) -> object:
            if x in env:
                return env[x]
            v = self.values.get(x.name)
            if isinstance(v, torch.SymInt):
                from ..constraints.base import concrete_dim

                return concrete_dim(v)
            return v

        for n in self.gm.graph.nodes:
            if n in kept_nodes:
                env[n] = new.node_copy(n, map_arg)
        users_kept = {n for n in kept_nodes if any(u in kept_nodes for u in n.users)}
        outs: list[torch.fx.Node] = []
        for g in keep:
            head, *items = self.groups[g]
            if head in users_kept and all(i in users_kept for i in items):
                continue
            if items:
                outs.extend(env[i] for i in items if i not in users_kept)
            elif isinstance(self.values.get(head.name), torch.Tensor) or "val" in head.meta and isinstance(head.meta["val"], torch.Tensor):
                outs.append(env[head])
            elif head not in users_kept:
                outs.append(env[head])
        new.output(tuple(outs))
        gm = torch.fx.GraphModule(root, new, class_name="Repro")
        gm.meta = dict(getattr(self.gm, "meta", {}))
        return Candidate(gm, inputs, self.key(keep), tuple(keep))


def _set_attr(root: torch.nn.Module, target: str, value: object) -> None:
    *path, last = target.split(".")
    mod = root
    for p in path:
        if not hasattr(mod, p):
            mod.add_module(p, torch.nn.Module())
        mod = getattr(mod, p)
    if isinstance(value, torch.nn.Parameter):
        mod.register_parameter(last, value)
    elif isinstance(value, torch.Tensor):
        mod.register_buffer(last, value)
    else:
        setattr(mod, last, value)


def _target_name(n: torch.fx.Node) -> str:
    from ..constraints.base import op_name

    if n.op == "call_function":
        return op_name(n.target)
    return f"{n.op}:{n.target}"
