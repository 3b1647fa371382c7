"""The built-in constraints: op denylist, shape alignment, dtype allowlist, layout, memory, rank,
dynamic shapes, and user callables."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence

import sympy
import torch
import torch.fx

from debug_framework.jsonio import JsonObject

from .base import Constraint, NodeInfo, Violation, concrete_dim, dim_to_json
from .memory import estimate_peak_memory

__all__ = [
    "DEFAULT_ALLOWED_DTYPES",
    "OpDenylistConstraint",
    "UnsupportedOpsConstraint",
    "ShapeConstraint",
    "DtypeConstraint",
    "LayoutConstraint",
    "MemoryConstraint",
    "MaxRankConstraint",
    "DynamicShapeConstraint",
    "CallableConstraint",
    "OpAllowlistConstraint",
    "as_constraint",
]

#: The one default dtype allowlist: what a typical inference/training accelerator supports.
#: float64 and complex types are absent on purpose.
DEFAULT_ALLOWED_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
     torch.int8, torch.uint8, torch.bool}
)


def _dtype(d: str | torch.dtype) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    value = getattr(torch, str(d).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {d!r}")
    return value


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


# --------------------------------------------------------------------------- ops


def _resolve_dotted(name: str) -> object:
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            return obj
        except AttributeError:
            return None
    return None


class OpDenylistConstraint(Constraint):
    """Ops the accelerator cannot run.

    Entries may be ATen names with or without overload (``"aten.convolution.default"``,
    ``"aten.convolution"``), torch-level names (``"torch.nn.functional.conv2d"``, ``"torch.nn.Conv2d"``,
    ``"conv2d"`` - matched against the torch call/module recorded in the node's ``source_fn_stack``,
    or for a backward node the forward call it differentiates: a torch-level entry covers that call's
    gradient too), or the objects themselves (``torch.ops.aten.convolution.default``, ``torch.nn.Conv2d``).
    """

    name = "unsupported_op"

    def __init__(self, ops: Iterable[object]) -> None:
        self.entries = list(ops)
        self._names: set[str] = set()
        self._objects: list[object] = []
        for entry in self.entries:
            if isinstance(entry, str):
                self._names.add(entry)
                if not entry.startswith(("aten.", "prims.")):
                    obj = _resolve_dotted(entry) if "." in entry else None
                    if obj is not None:
                        self._objects.append(obj)
            else:
                self._names.add(str(entry) if hasattr(entry, "_schema") or hasattr(entry, "overloads") else "")
                self._objects.append(entry)
        self._names.discard("")

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        if info.node.op != "call_function":
            return ()
        hit = None
        if info.op in self._names:
            hit = info.op
        elif info.packet in self._names:
            hit = info.packet
        else:
            short, fn = info.torch_origin
            if fn is not None:
                if short in self._names:
                    hit = short
                elif info.torch_op in self._names:
                    hit = info.torch_op
                elif any(fn is obj for obj in self._objects):
                    hit = info.torch_op
        if hit is None:
            return ()
        return (info.violation(self.name, f"op {info.op} is not supported (denylisted as {hit!r})",
                               limit=sorted(self._names) or [str(o) for o in self._objects], actual=info.op),)

    def describe(self) -> JsonObject:
        return {"name": self.name, "ops": sorted(self._names | {repr(o) for o in self._objects if not hasattr(o, "_schema")})}


UnsupportedOpsConstraint = OpDenylistConstraint


# --------------------------------------------------------------------------- shapes


class ShapeConstraint(Constraint):
    """Every checked dimension must be a multiple of ``alignment``.

    ``dims``: ``"all"``, ``"last"``, or a sequence of dimension indices (negative allowed, e.g.
    ``(-1, -2)``); dimensions a tensor does not have are skipped. 0-d tensors are skipped.
    Symbolic dims: ``symbolic="prove"`` (default) passes only when the size expression is provably a
    multiple (``8*s0`` for alignment 8); ``symbolic="hint"`` checks the current size hint instead.
    ``check_views``: whether outputs of view ops (no new memory) are checked too.
    """

    name = "shape_alignment"

    def __init__(self, alignment: int = 1, dims: str | Sequence[int] = "all", *, symbolic: str = "prove",
                 check_views: bool = True) -> None:
        if alignment < 1:
            raise ValueError("alignment must be >= 1")
        if symbolic not in ("prove", "hint"):
            raise ValueError("symbolic must be 'prove' or 'hint'")
        if isinstance(dims, str) and dims not in ("all", "last"):
            raise ValueError("dims must be 'all', 'last' or a sequence of ints")
        self.alignment = int(alignment)
        self.dims = dims if isinstance(dims, str) else tuple(int(d) for d in dims)
        self.symbolic = symbolic
        self.check_views = check_views

    def _dims(self, rank: int) -> Iterable[int]:
        if self.dims == "all":
            return range(rank)
        if self.dims == "last":
            return (rank - 1,) if rank else ()
        return sorted({d % rank for d in self.dims if -rank <= d < rank})

    def _aligned(self, d: object) -> bool:
        if isinstance(d, int):
            return d % self.alignment == 0
        if self.symbolic == "hint":
            c = concrete_dim(d)
            return c is not None and c % self.alignment == 0
        try:
            return sympy.Mod(d.node.expr, self.alignment) == 0
        except Exception:
            return False

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        if self.alignment == 1 or (info.is_view and not self.check_views):
            return ()
        out = []
        for t in info.tensors:
            shape = t.shape
            bad = [i for i in self._dims(len(shape)) if not self._aligned(shape[i])]
            if bad:
                out.append(info.violation(
                    self.name,
                    f"dims {bad} of shape {t.shape_json()} are not multiples of {self.alignment}",
                    limit={"alignment": self.alignment, "dims": self.dims},
                    actual={str(i): dim_to_json(shape[i]) for i in bad},
                    tensor=t,
                ))
        return out

    def describe(self) -> JsonObject:
        return {"name": self.name, "alignment": self.alignment, "dims": self.dims, "symbolic": self.symbolic,
                "check_views": self.check_views}


# --------------------------------------------------------------------------- dtypes


class DtypeConstraint(Constraint):
    """Every tensor's dtype must be in ``allowed_dtypes`` (names or ``torch.dtype``; default
    :data:`DEFAULT_ALLOWED_DTYPES`)."""

    name = "dtype"

    def __init__(self, allowed_dtypes: Iterable[str | torch.dtype] | None = None) -> None:
        self.allowed = frozenset(_dtype(d) for d in allowed_dtypes) if allowed_dtypes is not None else DEFAULT_ALLOWED_DTYPES

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        out = []
        for t in info.tensors:
            if t.dtype not in self.allowed:
                out.append(info.violation(self.name, f"dtype {_dtype_name(t.dtype)} is not supported",
                                          limit=sorted(_dtype_name(d) for d in self.allowed),
                                          actual=_dtype_name(t.dtype), tensor=t))
        return out

    def describe(self) -> JsonObject:
        return {"name": self.name, "allowed_dtypes": sorted(_dtype_name(d) for d in self.allowed)}


# --------------------------------------------------------------------------- layout


class LayoutConstraint(Constraint):
    """Tensors must be contiguous (row-major); channels-last optionally accepted.

    ``check_views=False`` (default) skips outputs of view ops (``transpose``, ``expand`` ...): they
    allocate nothing, so an accelerator sees their layout only when a consumer materialises them.
    """

    name = "layout"

    def __init__(self, require_contiguous: bool = True, allow_channels_last: bool = False,
                 check_views: bool = False) -> None:
        self.require_contiguous = require_contiguous
        self.allow_channels_last = allow_channels_last
        self.check_views = check_views

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        if not self.require_contiguous or (info.is_view and not self.check_views):
            return ()
        out = []
        for t in info.tensors:
            if t.t.dim() <= 1 or t.is_contiguous or (self.allow_channels_last and t.is_channels_last):
                continue
            kind = "channels-last" if t.is_channels_last else "non-contiguous"
            out.append(info.violation(
                self.name, f"{kind} tensor (strides {[dim_to_json(s) for s in t.t.stride()]})",
                limit={"contiguous": True, "channels_last_allowed": self.allow_channels_last},
                actual={"stride": [dim_to_json(s) for s in t.t.stride()]}, tensor=t))
        return out

    def describe(self) -> JsonObject:
        return {"name": self.name, "require_contiguous": self.require_contiguous,
                "allow_channels_last": self.allow_channels_last, "check_views": self.check_views}


# --------------------------------------------------------------------------- memory


class MemoryConstraint(Constraint):
    """Per-tensor size limit and/or peak live memory limit (bytes).

    The peak is estimated from the graph by liveness analysis (:func:`estimate_peak_memory`):
    inputs and parameters live throughout and count once, each op output is allocated at its node
    and freed after its last user, views share their base's memory.
    """

    name = "memory"

    def __init__(self, max_tensor_bytes: int | None = None, max_peak_bytes: int | None = None) -> None:
        self.max_tensor_bytes = max_tensor_bytes
        self.max_peak_bytes = max_peak_bytes

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        if self.max_tensor_bytes is None or info.is_view:
            return ()
        return [info.violation("memory_per_tensor", f"tensor of {t.nbytes} bytes exceeds {self.max_tensor_bytes}",
                               limit=self.max_tensor_bytes, actual=t.nbytes, tensor=t)
                for t in info.tensors if t.nbytes > self.max_tensor_bytes]

    def check_graph(self, gm: torch.fx.GraphModule, infos: list[NodeInfo], graph_name: str | None) -> Iterable[Violation]:
        if self.max_peak_bytes is None:
            return ()
        est = estimate_peak_memory(gm)
        if est.peak_bytes <= self.max_peak_bytes:
            return ()
        node = est.peak_node
        v = Violation("memory_peak", f"estimated peak live memory {est.peak_bytes} bytes exceeds {self.max_peak_bytes}",
                      limit=self.max_peak_bytes, actual=est.peak_bytes, graph=graph_name)
        if node is not None:
            info = NodeInfo(node, graph_name)
            v.node, v.op, v.source = node.name, info.op, info.source
        return (v,)

    def describe(self) -> JsonObject:
        return {"name": self.name, "max_tensor_bytes": self.max_tensor_bytes, "max_peak_bytes": self.max_peak_bytes}


# --------------------------------------------------------------------------- rank / dynamic / callables


class MaxRankConstraint(Constraint):
    name = "max_rank"

    def __init__(self, max_rank: int) -> None:
        self.max_rank = int(max_rank)

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        return [info.violation(self.name, f"rank {t.t.dim()} exceeds {self.max_rank}", limit=self.max_rank,
                               actual=t.t.dim(), tensor=t) for t in info.tensors if t.t.dim() > self.max_rank]

    def describe(self) -> JsonObject:
        return {"name": self.name, "max_rank": self.max_rank}


class DynamicShapeConstraint(Constraint):
    """With ``allow_dynamic=False`` every tensor with a symbolic size or stride is a violation."""

    name = "dynamic_shape"

    def __init__(self, allow_dynamic: bool = False) -> None:
        self.allow_dynamic = allow_dynamic

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        if self.allow_dynamic:
            return ()
        return [info.violation(self.name, f"symbolic shape {t.shape_json()} (dynamic shapes unsupported)",
                               limit="static", actual=t.shape_json(), tensor=t)
                for t in info.tensors if t.is_symbolic]

    def describe(self) -> JsonObject:
        return {"name": self.name, "allow_dynamic": self.allow_dynamic}


class CallableConstraint(Constraint):
    """A user rule: ``fn(info: NodeInfo)`` returns ``None``/``False``-y when fine, or a message string,
    a :class:`Violation`, or an iterable of those."""

    def __init__(self, fn: Callable[[NodeInfo], object], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "user_constraint")

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        result = self.fn(info)
        if not result:
            return ()
        items = [result] if isinstance(result, (str, Violation)) else list(result)
        return [r if isinstance(r, Violation) else info.violation(self.name, str(r), limit=self.name) for r in items]

    def describe(self) -> JsonObject:
        return {"name": self.name, "callable": getattr(self.fn, "__qualname__", repr(self.fn))}


def as_constraint(c: Constraint | Callable[[NodeInfo], object]) -> Constraint:
    if isinstance(c, Constraint):
        return c
    if callable(c):
        return CallableConstraint(c)
    raise TypeError(f"not a constraint: {c!r}")





class OpAllowlistConstraint(Constraint):
    """Only these ATen ops (with or without overload: ``"aten.mm"``, ``"aten.mm.default"``) are supported."""

    name = "op_not_in_allowlist"

    def __init__(self, ops: Iterable[object]) -> None:
        self.ops = frozenset(e if isinstance(e, str) else str(e) for e in ops)

    def check_node(self, info: NodeInfo) -> Iterable[Violation]:
        if info.node.op != "call_function" or info.op in self.ops or info.packet in self.ops:
            return ()
        return (info.violation(self.name, f"op {info.op} is not among the accelerator's supported ops",
                               limit=f"{len(self.ops)} supported ops", actual=info.op),)

    def describe(self) -> JsonObject:
        return {"name": self.name, "ops": sorted(self.ops)}
