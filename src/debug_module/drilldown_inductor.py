"""The Inductor drill-down: fused kernels hide intermediate values, so the minifier finds the operator.

Inductor fuses a layer's operators into a few generated kernels, so there is no per-operator value
to observe. Instead:

1. The layer is captured as an ATen graph on the reference's input to it (cast to the backend's
   dtype): ``torch.export`` of the layer called as the model calls it (its mask and positions from
   the session's inputs), decomposed to functional ATen (``run_decompositions({})``); weights are
   graph inputs, so the graph is a pure function. It is saved as ``graph_file`` (``.pt2``: Model
   Explorer opens it; node ids are the FX node names the rows carry).
2. The signature is the minifier's :class:`~debug_module.minifier.AccuracySignature` against
   float64 with the project's ratio rule: the graph compiled by the backend's compiler (Inductor,
   or the backend's own Inductor-based ``compiler``) may make at most ``noise_margin`` times the
   error of the same graph run eagerly at the backend's dtype (the trusted implementation at that
   precision) plus ``floor_eps x eps x RMS(that output's float64 value)``, per output of every
   candidate graph, as :meth:`~debug_framework.comparison.RatioRule.calibrated` sets the floor
   everywhere else. When the whole layer graph satisfies it, no operator is blamed (one compile).
3. Otherwise the minifier shrinks the graph (bisection, then delta debugging) to the smallest one
   on which the compiled graph still fails, writes the standalone repro and runs it in a fresh
   process (``verified``). The culprit is the first computing operator of that graph.

Rows: every operator of the layer graph, in order; ``introduced``/``bound`` are known only for the
culprit (measured on the minimal graph), the others are NaN: unobservable inside fused kernels.

Registered with ``debug_framework`` through the entry-point group ``debug_framework.drill_strategies``
(by :mod:`debug_module.drilldown`, which imports this module only when a layer is drilled;
``debug_framework`` never imports ``debug_module``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np
import torch

from debug_framework.comparison import RatioRule
from debug_framework.errors import DebugFrameworkError, ValidationError
from debug_framework.services.drilldown.paths import WRAPPER_ATTRIBUTE, module_path_in_model, source_line
from debug_framework.services.drilldown.support import BackendStrategy
from debug_framework.services.drilldown.types import Culprit, DrillRequest, LayerDrilldown, OperatorRow

from .constraints.base import op_name
from .minifier import AccuracySignature, Minifier

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.export.graph_signature import InputSpec
    from torch.utils._pytree import TreeSpec

    from debug_framework.jsonio import JsonObject

    from .minifier import MinifyResult

#: The layer's call rebuilt from its tensors: ``(args, kwargs)``.
Rebuild: TypeAlias = Callable[[tuple[torch.Tensor, ...]], tuple[tuple[object, ...], dict[str, object]]]


class LayerCallBackend(Protocol):
    """What the capture and the signature read of the Inductor backend: its dtype (``"float32"``...),
    its torch.compile backend (a name or a callable) and the call of one layer as the model makes it."""

    name: str
    dtype: str
    compiler: str | Callable[..., object]

    def layer_call(self, i: int, hidden_in: torch.Tensor, inputs: object
                   ) -> tuple[str, torch.nn.Module, tuple[object, ...], dict[str, object]]: ...

__all__ = ["InductorDrillStrategy", "capture_layer_graph", "layer_signature", "strip_dtype_pins"]

#: Operators that only reshape or alias: never named as the culprit while a computing one is there.
_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.permute.default", "aten.t.default",
                    "aten.transpose.int", "aten.expand.default", "aten.reshape.default", "aten.clone.default",
                    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.slice.Tensor", "aten.select.int",
                    "aten.contiguous.default", "getitem"})


class _Layer(torch.nn.Module):
    """The layer called with its tensor arguments flattened; ``rebuild(tensors) -> (args, kwargs)``
    (a function: torch.export deep-copies the module, and a function is copied by reference)."""

    def __init__(self, layer: torch.nn.Module, rebuild: Rebuild) -> None:
        super().__init__()
        setattr(self, WRAPPER_ATTRIBUTE, layer)
        self._rebuild = rebuild

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torch.utils import _pytree as pytree

        args, kwargs = self._rebuild(tensors)
        out = getattr(self, WRAPPER_ATTRIBUTE)(*args, **kwargs)
        return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))


def _rebuilder(leaves: list[object], spec: TreeSpec, slots: list[int]) -> Rebuild:
    """``rebuild(tensors)``: the call's ``(args, kwargs)`` with ``tensors`` in the tensor ``slots``."""
    from torch.utils import _pytree as pytree

    def rebuild(tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[object, ...], dict[str, object]]:
        filled = list(leaves)
        for slot, tensor in zip(slots, tensors, strict=True):
            filled[slot] = tensor
        return pytree.tree_unflatten(filled, spec)

    return rebuild


def capture_layer_graph(backend: LayerCallBackend, request: DrillRequest) -> tuple[ExportedProgram, list[torch.Tensor], str]:
    """The layer's functional ATen program on the reference's input (see the module docstring), its
    flat inputs (parameters and buffers, then the call's tensors) and the layer's module name."""
    from torch.utils import _pytree as pytree

    hidden = torch.as_tensor(np.asarray(request.hidden_in))
    layer_name, layer, args, kwargs = backend.layer_call(request.layer, hidden, request.inputs)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    slots = [k for k, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[k].detach().clone() for k in slots]  # normal tensors: the eager run made inference-mode ones
    wrapper = _Layer(layer, _rebuilder(leaves, spec, slots)).eval()
    sink = backend._wrapper._sink if getattr(backend, "_wrapper", None) is not None else []
    try:
        with torch.no_grad():
            program = torch.export.export(wrapper, tuple(tensors), strict=False).run_decompositions({})
    except Exception as exc:
        raise ValidationError(f"layer {request.layer} could not be captured as an ATen graph: {exc}",
                              hint="the layer must be traceable by torch.export") from exc
    finally:
        sink.clear()  # the checkpoint hooks inside the layer fired while tracing
    user = iter(tensors)
    inputs = [_program_input(program, spec_, user) for spec_ in program.graph_signature.input_specs]
    return program, inputs, layer_name


def _program_input(program: ExportedProgram, spec: InputSpec, user: Iterator[torch.Tensor]) -> torch.Tensor:
    """The value of one input of ``program``: the next of the call's tensors (``user``) for a user
    input, else the lifted parameter, buffer or constant."""
    from torch.export.graph_signature import InputKind

    if spec.kind == InputKind.USER_INPUT:
        return next(user)
    name = spec.target
    if name in program.state_dict:
        return program.state_dict[name].detach().clone()
    return program.constants[name].detach().clone()


class InductorDrillStrategy(BackendStrategy):
    """Drill layers of the ``inductor`` backend with the minifier (see the module docstring).

    ``max_seconds``: the minifier's time budget per layer (the smallest failing graph found by
    then is kept, with the minifier's ``stopped`` reason in the note)."""

    name = "minifier"
    backend_name, method, label = "inductor", "layer_call", "Inductor"

    def __init__(self, max_seconds: float = 600.0) -> None:
        self.max_seconds = max_seconds

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        out = self._start(request)
        backend = request.backend
        drill = LayerDrilldown(layer=request.layer, checkpoint=request.checkpoint, backend=backend.name, method="minifier")
        try:
            program, inputs, layer_name = capture_layer_graph(backend, request)
        except DebugFrameworkError as exc:
            drill.note = f"layer {request.layer} could not be drilled: {exc}"
            return drill
        graph_file = out / f"layer{request.layer}.pt2"
        torch.export.save(program, str(graph_file))
        gm = strip_dtype_pins(program.graph_module)
        drill.graph_file = str(graph_file)
        drill.operators = [_row(index, node, layer_name) for index, node in enumerate(_operators(gm))]
        signature = layer_signature(backend, request)
        holds, observed = signature.check(gm, inputs)
        compiler = backend.compiler if isinstance(backend.compiler, str) else getattr(backend.compiler, "__qualname__", "?")
        if observed.get("error"):
            drill.note = f"the layer's ATen graph failed under {compiler} (not a numerical finding): {observed['error']}"
            return drill
        if not holds:
            drill.note = (f"the layer's ATen graph compiled by {compiler} passes the float64 ratio rule: "
                          "no operator introduces error on its own")
            return drill
        try:
            result = Minifier(gm, inputs, signature, max_seconds=self.max_seconds, progress=False, verify=True,
                              output_dir=out / "repro", title=f"layer {request.layer} ({request.checkpoint})").minify()
        except DebugFrameworkError as exc:  # e.g. the failure did not hold again (non-determinism)
            drill.note = f"the minifier could not reduce layer {request.layer}: {exc}"
            return drill
        return self._named(drill, result, signature)

    @staticmethod
    def _named(drill: LayerDrilldown, result: MinifyResult, signature: AccuracySignature) -> LayerDrilldown:
        """``drill`` with the culprit: the first computing operator of the minimal graph."""
        minimal = [n.name for n in _operators(result.gm)]
        by_name = {row.node: row for row in drill.operators}
        found = [by_name[name] for name in minimal if name in by_name]
        computing = [row for row in found if row.op not in _VIEWS] or found
        if not computing:
            drill.note = f"the minifier's graph ({', '.join(result.ops)}) has no operator of the layer graph"
            return drill
        culprit = computing[0]
        introduced, bound = _worst_failure(signature.observe(result.gm, result.inputs))
        measured = OperatorRow(index=culprit.index, node=culprit.node, op=culprit.op, module_path=culprit.module_path,
                               source=culprit.source, introduced=introduced, bound=bound)
        drill.operators = [measured if row is culprit else row for row in drill.operators]
        drill.culprit = Culprit(op=culprit.op, node=culprit.node, module_path=culprit.module_path, source=culprit.source,
                                repro_dir=None if result.repro_path is None else str(Path(result.repro_path).parent),
                                verified=bool(result.verified))
        notes = [f"the minimal failing graph holds {len(computing)} operators: {', '.join(r.op for r in computing)}"
                 if len(computing) > 1 else "", f"minifier stopped early: {result.stopped}" if result.stopped else "",
                 *([] if result.verified else result.notes)]
        drill.note = "; ".join(n for n in notes if n)
        return drill


def layer_signature(backend: LayerCallBackend, request: DrillRequest) -> AccuracySignature:
    """The minifier's signature for a layer of ``backend``: its compiler against float64 by the ratio
    rule, ``noise_margin`` x eager's error at the backend's dtype + ``floor_eps x eps x RMS(output)``
    for each output of the graph judged (the floor :meth:`RatioRule.calibrated` sets elsewhere)."""
    eps = float(torch.finfo(getattr(torch, backend.dtype)).eps)
    return AccuracySignature(backend.compiler, reference="float64", ratio=RatioRule(float(request.noise_margin), 0.0),
                             floor_rms=float(request.floor_eps) * eps)


def _worst_failure(observed: JsonObject) -> tuple[float, float]:
    """``(introduced, bound)`` of the worst failing output of a signature's observation, by margin
    over its bound (a failure without a measured error, e.g. a non-finite mismatch, first); NaN
    where one was not measured (a measured 0.0 stays 0.0)."""
    def number(value: object) -> float:
        return math.nan if value is None else float(value)

    def rank(o: JsonObject) -> float:
        margin = OperatorRow(index=0, node="", op="", introduced=number(o.get("test_error")),
                             bound=number(o.get("bound"))).margin
        return math.inf if math.isnan(margin) else margin

    failing = [o for o in observed.get("outputs", []) if not o.get("passed", True)]
    worst = max(failing, key=rank, default={})
    return number(worst.get("test_error")), number(worst.get("bound"))


def strip_dtype_pins(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` without what would pin the float64 reference run to the captured dtype and
    changes nothing in the captured run: the tracer's metadata checks (``aten._assert_*``), casts
    to the dtype a value already has (RMSNorm's ``.to(float32)`` in a float32 model) and a softmax
    ``dtype`` equal to its input's (attention's ``softmax(..., dtype=float32)``)."""
    import copy

    stripped = copy.deepcopy(gm)
    for node in list(stripped.graph.nodes):
        if node.op != "call_function":
            continue
        if _is_assert(node) and not node.users:
            stripped.graph.erase_node(node)
        elif _is_noop_cast(node):
            node.replace_all_uses_with(node.args[0])
            stripped.graph.erase_node(node)
        elif node.target in _SOFTMAXES and len(node.args) == 3 and _same_dtype(node.args[0], node.args[2]):
            node.args = (*node.args[:2], None)  # softmax(x, dim, dtype=x.dtype): the dtype changes nothing
    stripped.recompile()
    return stripped


_SOFTMAXES = (torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int)


def _same_dtype(value: object, dtype: torch.dtype) -> bool:
    """Whether the traced ``value`` (an FX node) already has ``dtype``."""
    val = getattr(value, "meta", {}).get("val") if isinstance(value, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == dtype


def _is_noop_cast(node: torch.fx.Node) -> bool:
    """A ``_to_copy`` that only sets the dtype its input already has (same device, no layout change)."""
    if node.target is not torch.ops.aten._to_copy.default or set(node.kwargs) - {"dtype", "layout", "device"}:
        return False
    source = node.args[0] if node.args else None
    before = getattr(source, "meta", {}).get("val") if isinstance(source, torch.fx.Node) else None
    after = node.meta.get("val")
    return (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and before.dtype == after.dtype
            and before.device == after.device and before.layout == after.layout)


def _is_assert(node: torch.fx.Node) -> bool:
    return op_name(node.target).startswith("aten._assert")


def _operators(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The operators of ``gm`` in order, without the tracer's metadata checks (``aten._assert_*``)."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and not _is_assert(n)]


def _row(index: int, node: torch.fx.Node, layer_name: str) -> OperatorRow:
    """The row of one operator: its overload, module path and source line; errors unobserved (NaN)."""
    stack = node.meta.get("nn_module_stack") or {}
    scope = ""
    if stack:
        path = list(stack.values())[-1][0]
        scope = path.removeprefix("L['self'].").removeprefix("L__self__.")
    return OperatorRow(index=index, node=node.name, op=op_name(node.target),
                       module_path=module_path_in_model(scope, layer_name), source=source_line(node.meta.get("stack_trace")))
