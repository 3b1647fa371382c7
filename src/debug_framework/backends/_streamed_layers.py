"""Weights converted to the compute dtype as they are used: the generic tier's float64 reference
(and its calibration run) without a whole-model float64 copy.

* **Layers.** A model's repeated layers (the children of its outermost ``nn.ModuleList`` s:
  decoder layers, encoder blocks, a vision tower's blocks) keep their parameters as the weights
  store them (bfloat16 pages of the file, mapped copy-on-write). When a module inside a layer is
  called and no enclosing module has converted it yet (a whole layer from the model's forward, one
  MLP block from a block replay), its parameters become compute-dtype copies for the call, and the
  stored tensors come back when it returns, even by an exception.
* **Large tables outside the layers.** A two-dimensional parameter outside the layers with at
  least :data:`STREAMED_TABLE_ELEMENTS` elements (token embeddings, the LM head, however the model
  wraps them) keeps its stored weight too. While the model runs, :class:`StoredTables` converts
  what each use takes from it: an embedding lookup converts the rows it gathered, a linear
  function converts :data:`~debug_framework.architectures.layout.HEAD_BLOCK_BYTES` of rows at a
  time and computes their outputs.
* Everything else (norms, small tables, buffers) is held at the compute dtype.

Each use computes what a whole-model conversion would: the same values meet the same operations
(a gathered row converted is the converted table's row; each output of a blocked linear function
is the same dot product). So the backend holds the other tensors and at most one layer at the
compute dtype.

Model code that reads a stored parameter's dtype (``x.to(self.lm_head.weight.dtype)``,
``self.dtype``) would see the stored dtype: :class:`NoNarrowing` keeps every compute-dtype tensor at
the compute dtype where code casts it narrower, and the models' ``dtype`` reports the compute dtype
(:func:`report_dtype`). A stored parameter used in arithmetic that converts nothing (a layer's
parameter outside its layer, a table in a matrix product) fails loudly (two dtypes); the backend
runs the model's forward at preparation and falls back to a whole-model load where it fails
(:class:`~debug_framework.backends.eager_reference.EagerReferenceBackend`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..architectures.layout import HEAD_BLOCK_BYTES, STREAMED_TABLE_ELEMENTS
from ..capture.hooks import skipped_forward

__all__ = ["StreamPlan", "stream_model", "LayerStreamer", "StoredTables", "NoNarrowing", "STREAMED_TABLE_ELEMENTS"]


def _layer_units(net: torch.nn.Module) -> list[str]:
    """The names of the modules streamed one at a time: the children holding parameters of each
    outermost ``nn.ModuleList`` (one inside another's child is part of that child)."""
    units: list[str] = []
    lists = [name for name, mod in net.named_modules() if isinstance(mod, torch.nn.ModuleList)]
    outer = [name for name in lists if not any(name.startswith(other + ".") for other in lists if other != name)]
    for name in outer:
        container = net.get_submodule(name) if name else net
        for child, mod in container.named_children():
            if any(True for _ in mod.parameters()):
                units.append(f"{name}.{child}" if name else child)
    return units


def _streamed_tables(net: torch.nn.Module, units: list[str]) -> list[str]:
    """The parameters outside ``units`` kept as stored (see the module's docstring)."""
    inside = tuple(unit + "." for unit in units)
    renorm = {f"{name}.weight" for name, mod in net.named_modules()
              if isinstance(mod, torch.nn.Embedding) and mod.max_norm is not None}  # writes its table
    return [name for name, param in net.named_parameters()
            if not name.startswith(inside) and name not in renorm and param.dim() == 2
            and param.is_floating_point() and param.numel() >= STREAMED_TABLE_ELEMENTS]


class StreamPlan:
    """Which tensors of a model stay as stored: its layers' (``units``, module names) and its large
    tables (``tables``, parameter names), found from the module structure (a model on the ``meta``
    device will do)."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.units = _layer_units(net)
        self.tables = _streamed_tables(net, self.units)
        self._prefixes = tuple(unit + "." for unit in self.units)

    def keeps(self, name: str) -> bool:
        """Whether the parameter ``name`` stays as stored."""
        return name.startswith(self._prefixes) or name in self.tables


def _settle_shared(net: torch.nn.Module, plan: StreamPlan, dtype: torch.dtype) -> None:
    """A layer's parameter kept as stored that a module outside the layers also holds (and no table
    converts) is converted to ``dtype`` for good: no hook converts it there."""
    owners: dict[int, tuple[torch.nn.Parameter, list[str]]] = {}
    for name, mod in net.named_modules(remove_duplicate=False):
        for param in mod._parameters.values():
            if param is not None:
                owners.setdefault(id(param), (param, []))[1].append(name)
    tables = {id(param) for name, param in net.named_parameters(remove_duplicate=False) if name in plan.tables}
    with torch.no_grad():
        for key, (param, names) in owners.items():
            if param.dtype == dtype or not param.is_floating_point() or key in tables:
                continue
            if not all(n.startswith(plan._prefixes) for n in names):
                param.data = param.data.to(dtype)


def stream_model(net: torch.nn.Module, plan: StreamPlan, dtype: torch.dtype) -> None:
    """Make ``net``, loaded with the tensors ``plan`` keeps as stored, compute in ``dtype``: its
    layers convert as called (``net.streamer``), its tables as used while ``net.stored_tables`` is
    entered, its models report ``dtype``."""
    _settle_shared(net, plan, dtype)
    report_dtype(net, dtype)
    net.streamer = LayerStreamer(net, plan.units, dtype)  # type: ignore[assignment]
    params = dict(net.named_parameters(remove_duplicate=False))
    net.stored_tables = StoredTables([params[n] for n in plan.tables if params[n].dtype != dtype],  # type: ignore[assignment]
                                     dtype)


class LayerStreamer:
    """Hooks on every module inside ``units`` of ``net`` that give a called module's parameters the
    compute ``dtype`` for the call (see the module's docstring).

    The converted parameters of the last layer used are kept until another layer's are needed: a
    replay that runs a layer and then one of its blocks converts it once. The next layer is then
    converted into the same buffers where the shapes agree (a fresh allocation of this size costs
    ten times the conversion in page faults; what a layer returns is computed from its input, never a
    view of its parameters, so nothing captured shares them). So one layer's converted copy exists at
    a time, and
    none of a module whose forward a replay skips
    (:func:`~debug_framework.capture.hooks.skipped_forward`)."""

    def __init__(self, net: torch.nn.Module, units: list[str], dtype: torch.dtype) -> None:
        self.dtype = dtype
        #: one entry per module call in progress: the stored tensors it replaced (None: nothing)
        self._calls: list[list[tuple[torch.nn.Parameter, torch.Tensor]] | None] = []
        self._converting = 0
        self._unit_of: dict[int, int] = {}  # id(module) -> its unit's index
        #: the unit whose converted parameters are kept, and them (id(parameter) -> converted)
        self._kept_unit: int | None = None
        self._kept: dict[int, torch.Tensor] = {}
        #: the previous layer's buffers, reused for the next one's: (shape) -> tensors
        self._spare: dict[tuple[int, ...], list[torch.Tensor]] = {}
        #: while :meth:`hold` is in force: the other layers' converted parameters kept (unit -> them),
        #: the bytes they take and the most they may take
        self._held: dict[int, dict[int, torch.Tensor]] | None = None
        self._held_units: set[int] = set()
        self._held_bytes = 0
        self._hold_budget = 0
        #: set while every parameter is already at the compute dtype (a decode's whole conversion in
        #: place): the hooks then convert nothing and return at once
        self.paused = False
        for index, unit in enumerate(units):
            for mod in net.get_submodule(unit).modules():
                self._unit_of.setdefault(id(mod), index)
                mod.register_forward_pre_hook(self._enter)
                mod.register_forward_hook(self._leave, always_call=True)

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        if self.paused or self._converting or module.__dict__.get("forward") is skipped_forward:
            self._calls.append(None)  # converted by an enclosing call already, or not run at all
            return
        unit = self._unit_of.get(id(module))
        if unit != self._kept_unit:  # the last layer's copies become this one's buffers (or are held)
            last, self._kept = self._kept, {}
            if self._held is not None and self._kept_unit is not None and last and self._room_for(self._kept_unit, last):
                self._held[self._kept_unit] = last
            else:
                self._spare.clear()
                for tensor in last.values():
                    self._spare.setdefault(tuple(tensor.shape), []).append(tensor)
            if self._held is not None and unit is not None and unit in self._held:
                self._kept = self._held.pop(unit)
            self._kept_unit = unit
        swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        seen: set[int] = set()
        with torch.no_grad():
            for param in module.parameters():
                if id(param) in seen or param.dtype == self.dtype or not param.is_floating_point():
                    continue
                seen.add(id(param))
                stored = param.data
                converted = self._kept.get(id(param))
                if converted is None:
                    spare = self._spare.get(tuple(stored.shape))
                    converted = spare.pop().copy_(stored) if spare else stored.to(self.dtype)
                    self._kept[id(param)] = converted
                param.data = converted
                swapped.append((param, stored))
        self._converting += 1
        self._calls.append(swapped)

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        swapped = self._calls.pop()
        if swapped is None:
            return
        self._converting -= 1
        for param, stored in swapped:
            param.data = stored

    def _room_for(self, unit: int, converted: dict[int, torch.Tensor]) -> bool:
        """Whether ``unit``'s converted parameters may be held (counted once, within the budget)."""
        if unit in self._held_units:
            return True
        size = sum(t.numel() * t.element_size() for t in converted.values())
        if self._held_bytes + size > self._hold_budget:
            return False
        self._held_units.add(unit)
        self._held_bytes += size
        return True

    def hold(self, budget_bytes: int) -> None:
        """Until :meth:`release`, keep every layer's converted parameters once converted, up to
        ``budget_bytes`` in all (the layers beyond it still convert as called): a decode runs every
        layer at every step, and converting them again each step is a fifth of a float64 step."""
        self._held, self._held_units, self._held_bytes, self._hold_budget = {}, set(), 0, max(0, int(budget_bytes))

    def release(self) -> None:
        """Drop the kept layer's converted copies, the held ones and the buffers kept for the next."""
        self._kept.clear()
        self._spare.clear()
        self._kept_unit = None
        self._held, self._held_units, self._held_bytes, self._hold_budget = None, set(), 0, 0


_EMBEDDING = (torch.nn.functional.embedding,)
_LINEAR = (torch.nn.functional.linear,)


class StoredTables(TorchFunctionMode):
    """While entered, an embedding lookup in one of ``tables`` (parameters kept as stored) gives
    its gathered rows in ``dtype``, and a linear function of one computes in ``dtype``, converting
    :data:`~debug_framework.architectures.layout.HEAD_BLOCK_BYTES` of rows at a time: what the
    table converted whole would give, without it."""

    def __init__(self, tables: list[torch.Tensor], dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._ids = {id(t) for t in tables}

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _EMBEDDING and len(args) > 1 and id(args[1]) in self._ids:
            return func(*args, **kwargs).to(self.dtype)
        if func in _LINEAR and len(args) > 1 and id(args[1]) in self._ids:
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return self._linear(args[0], args[1], bias)
        return func(*args, **kwargs)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        dtype = self.dtype
        rows = max(1, min(weight.shape[0], HEAD_BLOCK_BYTES // max(1, weight.shape[1] * dtype.itemsize)))
        block = torch.empty((rows, weight.shape[1]), dtype=dtype)  # one buffer for every block's rows
        parts = []
        for i in range(0, weight.shape[0], rows):
            n = min(rows, weight.shape[0] - i)
            rows_i = block[:n].copy_(weight[i:i + n])
            parts.append(torch.nn.functional.linear(x, rows_i, None if bias is None else bias[i:i + n].to(dtype)))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


_DTYPE_CLASSES: dict[tuple[type, torch.dtype], type] = {}


def report_dtype(net: torch.nn.Module, dtype: torch.dtype) -> None:
    """Make every ``transformers`` model inside ``net`` (itself, its base model) report ``dtype`` as
    its ``dtype``: ``transformers`` reads it from the first floating parameter, which may be a
    table kept as stored."""
    for mod in net.modules():
        cls = type(mod)
        if not isinstance(getattr(cls, "dtype", None), property):
            continue
        key = (cls, dtype)
        if key not in _DTYPE_CLASSES:
            _DTYPE_CLASSES[key] = type(cls.__name__, (cls,), {"dtype": property(lambda self, d=dtype: d),
                                                              "__module__": cls.__module__,
                                                              "__qualname__": cls.__qualname__})
        mod.__class__ = _DTYPE_CLASSES[key]


_NARROWER = {torch.float64: (torch.float32, torch.float16, torch.bfloat16), torch.float32: (torch.float16, torch.bfloat16)}
_SOFTMAX = (torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax, torch.nn.functional.log_softmax,
            torch.log_softmax, torch.Tensor.log_softmax)
_CASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)
#: every function :class:`NoNarrowing` may change (any other passes straight through, looked up once)
_WATCHED = frozenset((*_SOFTMAX, *_CASTS, torch.Tensor.to))


class NoNarrowing(TorchFunctionMode):
    """Keep tensors of the compute ``dtype`` at it where the model's code casts them narrower:
    ``.to(torch.float32)``, ``.float()``, ``.half()``, ``.bfloat16()``, a softmax's ``dtype=``.

    In float64 this makes the model's own code a float64 computation throughout: ``transformers``'
    RMSNorm computes in float32 (``hidden_states.to(torch.float32)``) and its eager attention's
    softmax in float32, which in a reference would round every norm and every attention
    probability to float32 (and a fully masked row, every score the float64 minimum, would be NaN
    in float32). Casts of other tensors (token positions to float32) are left as written."""

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.dtype = dtype
        self.narrower = _NARROWER.get(dtype, ())

    def _ours(self, tensor: Any) -> bool:
        return isinstance(tensor, torch.Tensor) and tensor.dtype is self.dtype

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func not in _WATCHED:  # the hot path: hundreds of calls a decode step, none of them a cast
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if not args or not self._ours(args[0]):
            return func(*args, **kwargs)
        if func in _CASTS:
            return args[0]
        if func in _SOFTMAX:
            if kwargs.get("dtype") in self.narrower:
                kwargs["dtype"] = self.dtype
            elif len(args) > 2 and args[2] in self.narrower:
                args = (*args[:2], self.dtype, *args[3:])
        elif func is torch.Tensor.to:
            if kwargs.get("dtype") in self.narrower:
                kwargs["dtype"] = self.dtype
            rest = []
            for arg in args[1:]:
                if isinstance(arg, torch.dtype) and arg in self.narrower:
                    arg = self.dtype
                elif isinstance(arg, torch.Tensor) and arg.dtype in self.narrower:  # .to(other)
                    rest.extend([arg.device, self.dtype])
                    continue
                rest.append(arg)
            args = (args[0], *rest)
        return func(*args, **kwargs)
