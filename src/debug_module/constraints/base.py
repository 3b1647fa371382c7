"""Constraint primitives: what one graph node looks like to a constraint, and what a violation records.

Everything here works on ATen-level FX graphs produced by AOTAutograd, reading the FakeTensor in
``node.meta["val"]`` (shape, dtype, strides) - nothing is executed.
"""

from __future__ import annotations

import operator
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property

import torch
import torch.fx

from debug_framework.jsonio import JsonObject

__all__ = [
    "Violation",
    "SourceLocation",
    "TensorMeta",
    "NodeInfo",
    "Constraint",
    "op_name",
    "dim_to_json",
    "concrete_dim",
]


# --------------------------------------------------------------------------- source lines

_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n(?P<code>[^\n]*)')


@dataclass(frozen=True)
class SourceLocation:
    """The user's source line a graph node came from (innermost frame of ``node.meta["stack_trace"]``)."""

    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}: {self.code}"

    @classmethod
    def from_stack_trace(cls, stack_trace: str | None) -> SourceLocation | None:
        if not stack_trace:
            return None
        frames = list(_FRAME_RE.finditer(stack_trace))
        if not frames:
            return None
        m = frames[-1]
        return cls(m["file"], int(m["line"]), m["func"].strip(), m["code"].strip())


# --------------------------------------------------------------------------- violations


@dataclass
class Violation:
    """One broken constraint. Every field is JSON-serialisable (see :meth:`to_dict`).

    ``node``/``op``/``shape``/``dtype`` describe the offending graph node (``None`` for a
    graph-level violation); ``limit`` is the constraint's bound and ``actual`` what the graph has.
    ``shape`` entries are ints, or strings for symbolic dims (``"s0"``).
    """

    constraint: str
    message: str
    limit: object = None
    actual: object = None
    node: str | None = None
    op: str | None = None
    torch_op: str | None = None
    shape: list[int | str] | None = None
    dtype: str | None = None
    source: SourceLocation | None = None
    graph: str | None = None

    def describe(self) -> str:
        parts = [f"[{self.constraint}] {self.message}"]
        if self.node is not None:
            parts.append(f"node={self.node} op={self.op}")
        if self.shape is not None:
            parts.append(f"shape={self.shape}")
        if self.dtype is not None:
            parts.append(f"dtype={self.dtype}")
        parts.append(f"limit={self.limit!r}")
        if self.source is not None:
            parts.append(f"at {self.source}")
        return " | ".join(parts)

    def to_dict(self) -> JsonObject:
        data = asdict(self)
        data["source"] = asdict(self.source) if self.source is not None else None
        return data


# --------------------------------------------------------------------------- tensor / node views


def concrete_dim(d: object) -> int | None:
    """An int for a dim: the value, or the size hint of a symbolic dim (``None`` if it has none)."""
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt):
        hint = getattr(d.node, "hint", None)
        if hint is not None:
            return int(hint)
        try:
            return int(d.node.shape_env.size_hint(d.node.expr))
        except Exception:
            return None
    return int(d)


def dim_to_json(d: object) -> int | str:
    return d if isinstance(d, int) else str(d)


class TensorMeta:
    """Read-only facts of one FakeTensor (or real tensor), computed lazily."""

    __slots__ = ("t", "__dict__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    @cached_property
    def shape(self) -> tuple[int | torch.SymInt, ...]:
        return tuple(self.t.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.t.dtype

    @cached_property
    def is_symbolic(self) -> bool:
        return any(not isinstance(d, int) for d in self.shape) or any(
            not isinstance(s, int) for s in self.t.stride()
        )

    @cached_property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= concrete_dim(d) or 0
        return n

    @cached_property
    def nbytes(self) -> int:
        """Bytes of the elements this tensor addresses (numel x itemsize; hints for symbolic dims)."""
        return self.numel * self.t.element_size()

    @cached_property
    def is_contiguous(self) -> bool:
        return bool(self.t.is_contiguous())

    @cached_property
    def is_channels_last(self) -> bool:
        if self.t.dim() == 4:
            return bool(self.t.is_contiguous(memory_format=torch.channels_last))
        if self.t.dim() == 5:
            return bool(self.t.is_contiguous(memory_format=torch.channels_last_3d))
        return False

    def shape_json(self) -> list[int | str]:
        return [dim_to_json(d) for d in self.shape]


def op_name(target: object) -> str:
    """``aten.convolution.default`` for an OpOverload; a dotted name for Python callables."""
    if isinstance(target, str):
        return target
    if hasattr(target, "_schema") or hasattr(target, "overloadpacket"):
        return str(target)
    if target is operator.getitem:
        return "getitem"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}.{name}" if module else name


def _flatten_tensors(val: object) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        out: list[torch.Tensor] = []
        for v in val:
            out.extend(_flatten_tensors(v))
        return out
    return []


class NodeInfo:
    """One FX node as constraints see it: ATen op name, torch-level origin, output tensors, source line."""

    __slots__ = ("node", "graph_name", "__dict__")

    def __init__(self, node: torch.fx.Node, graph_name: str | None = None) -> None:
        self.node = node
        self.graph_name = graph_name

    @cached_property
    def op(self) -> str:
        if self.node.op == "call_function":
            return op_name(self.node.target)
        return self.node.op

    @cached_property
    def packet(self) -> str:
        """The op without its overload (``aten.convolution``)."""
        packet = getattr(self.node.target, "overloadpacket", None)
        return str(packet) if packet is not None else self.op

    @cached_property
    def is_view(self) -> bool:
        """Whether the op returns an alias of an input (its output allocates no memory)."""
        return bool(getattr(self.node.target, "is_view", False))

    @cached_property
    def torch_origin(self) -> tuple[str | None, object]:
        """(short name, torch-level callable or module class) that produced this node, if recorded.
        A backward node answers with the forward call it differentiates (AOTAutograd records it as
        ``fwd_source_fn_stack``), so a torch-level name covers that call's gradient too."""
        stack = self.node.meta.get("source_fn_stack") or self.node.meta.get("fwd_source_fn_stack")
        if stack:
            name, fn = stack[-1]
            return str(name), fn
        return None, None

    @cached_property
    def torch_op(self) -> str | None:
        name, fn = self.torch_origin
        if fn is None:
            return None
        if isinstance(fn, str):
            return fn
        return op_name(fn)

    @cached_property
    def tensors(self) -> list[TensorMeta]:
        return [TensorMeta(t) for t in _flatten_tensors(self.node.meta.get("val"))]

    @cached_property
    def source(self) -> SourceLocation | None:
        return SourceLocation.from_stack_trace(self.node.meta.get("stack_trace"))

    def violation(self, constraint: str, message: str, *, limit: object = None, actual: object = None,
                  tensor: TensorMeta | None = None) -> Violation:
        """A :class:`Violation` at this node, filled with its op, shape, dtype and source line."""
        t = tensor if tensor is not None else (self.tensors[0] if self.tensors else None)
        return Violation(
            constraint=constraint,
            message=message,
            limit=limit,
            actual=actual,
            node=self.node.name,
            op=self.op,
            torch_op=self.torch_op,
            shape=t.shape_json() if t is not None else None,
            dtype=str(t.dtype).removeprefix("torch.") if t is not None else None,
            source=self.source,
            graph=self.graph_name,
        )


# --------------------------------------------------------------------------- constraint base


class Constraint(ABC):
    """A rule an accelerator imposes on ATen graphs.

    Subclasses implement :meth:`check_node` (called for every placeholder and ``call_function``
    node except ``getitem``) and/or override :meth:`check_graph` for whole-graph rules. Both yield
    :class:`Violation` objects - every one, not only the first.
    """

    #: Short identifier used in violation records (``"dtype"``, ``"shape_alignment"`` ...).
    name: str = "constraint"

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:  # noqa: ARG002
        return ()

    def check_graph(self, gm: torch.fx.GraphModule, infos: list[NodeInfo], graph_name: str | None) -> Iterable[Violation]:  # noqa: ARG002
        return ()

    @property
    def node_level(self) -> bool:
        return type(self).check_node is not Constraint.check_node

    @abstractmethod
    def describe(self) -> JsonObject:
        """JSON-ready configuration of this constraint (written into reports)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.describe().items() if k != "name")
        return f"{type(self).__name__}({args})"


def iter_checked_nodes(gm: torch.fx.GraphModule, graph_name: str | None) -> Iterator[NodeInfo]:
    for node in gm.graph.nodes:
        if node.op == "placeholder" or (node.op == "call_function" and node.target is not operator.getitem):
            yield NodeInfo(node, graph_name)

