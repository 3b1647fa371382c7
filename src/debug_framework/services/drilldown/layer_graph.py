"""One layer of a torch model as an ATen graph, each operator tagged with its ``nn.Module`` path and
the source line that emitted it.

The layer is captured the way the model calls it: a forward pass of the whole model stops at the
layer's first pre-hook and keeps its arguments (masks, position embeddings, flags), so the layer's
own hooks and whatever the model hands it are part of the call. The call is then traced with
``make_fx`` (real tensors, the dispatcher's ops after autograd: ``aten.addmm``, ``aten.gelu``,
``aten._softmax``...), the layer's parameters and buffers lifted to graph inputs by
``torch.func.functional_call`` and in-place ops removed by ``torch.func.functionalize``. A linear
holding a torchao-quantized weight is one operator (``debug_framework::quantized_linear``) whose
inputs are the weight's inner tensors (``param:<weight>.qdata``...: :mod:`debug_framework.backends.torchao`).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from ...backends.torchao.leaves import QuantizedLeaves

__all__ = ["LayerCall", "LayerGraph", "capture_layer_call", "trace_layer", "node_module_path", "node_source",
           "run_graph", "is_cast", "map_float_dtypes"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(os.path.abspath(__file__))
#: the module whose stand-in forward calls a torchao-quantized linear: no source line of the model's
_LEAF_FILE = os.path.abspath(os.path.join(_HERE, "..", "..", "backends", "torchao", "leaves.py"))


class _SourceLines(TorchFunctionMode):
    """While tracing, each torch call publishes the user frames that made it (outside torch and
    this package) as the ``stack_trace`` of the nodes it creates."""

    def __torch_function__(self, func: Callable[..., object], types: tuple[type, ...], args: tuple[object, ...] = (),
                           kwargs: dict[str, object] | None = None) -> object:
        frames = [f for f in traceback.extract_stack()[:-1]
                  if not f.filename.startswith(_TORCH_DIR) and not f.filename.startswith(_HERE)
                  and os.path.abspath(f.filename) != _LEAF_FILE]
        meta = fx_traceback.get_current_meta()
        meta["stack_trace"] = "".join(traceback.format_list(frames[-4:]))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            meta.pop("stack_trace", None)


class _Stop(Exception):
    """Raised by the capturing pre-hook to end the forward pass at the layer."""


@dataclass
class LayerCall:
    """How the model calls one layer: the hidden state, the other positional arguments and the
    keyword arguments, as the model passed them (before the layer's own pre-hooks). At a decode
    step, ``cache`` is the layer's entry of the model's KV cache (a
    :class:`~.decode_step.CacheSlot`: ``keys``, ``values``, ``load(keys, values)``), whose past
    the traced graph takes as inputs; None for a call without a cache."""

    hidden: torch.Tensor
    rest_args: tuple[object, ...]
    kwargs: dict[str, object]
    hidden_keyword: bool  # the hidden state came as kwargs["hidden_states"]
    cache: object = None


@dataclass
class LayerGraph:
    """A traced layer: the graph, its inputs in placeholder order (each named by a path:
    ``param:<name>``, ``hidden``, ``args.<i>...``, ``kwargs.<name>...``) and the values traced with."""

    gm: torch.fx.GraphModule
    layer_name: str
    input_paths: list[str]
    inputs: list[torch.Tensor]

    def placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"]


def capture_layer_call(module: torch.nn.Module, layer_name: str, forward_kwargs: dict[str, object]) -> LayerCall:
    """Run ``module(**forward_kwargs)`` until layer ``layer_name`` is called; how it was called."""
    layer = module.get_submodule(layer_name)
    seen: dict[str, object] = {}

    def pre(_mod: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        seen["args"], seen["kwargs"] = args, dict(kwargs)
        raise _Stop

    handle = layer.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
    try:
        with torch.no_grad(), contextlib.suppress(_Stop):
            module(**forward_kwargs)
    finally:
        handle.remove()
    if "args" not in seen:
        raise RuntimeError(f"the forward pass never called {layer_name!r}")
    args, kwargs = _plain(seen["args"]), _plain(seen["kwargs"])
    if args:
        return LayerCall(args[0], tuple(args[1:]), kwargs, False)
    hidden = kwargs.pop("hidden_states")
    return LayerCall(hidden, (), kwargs, True)


def _plain(value: object) -> object:
    """``value`` with every object that is not a tensor, a plain value or a container of them (a
    key/value cache, which a traced call would append to) replaced by None."""
    if isinstance(value, (torch.Tensor, int, float, str, bool, type(None), torch.dtype, torch.device)):
        return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return None


def _flatten(value: object, path: str, paths: list[str], leaves: list[torch.Tensor]) -> object:
    """``value`` with every tensor replaced by its index in ``leaves`` (a ``_Leaf``)."""
    if isinstance(value, torch.Tensor):
        paths.append(path)
        leaves.append(value)
        return _Leaf(len(leaves) - 1)
    if isinstance(value, dict):
        return {k: _flatten(v, f"{path}.{k}", paths, leaves) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_flatten(v, f"{path}.{i}", paths, leaves) for i, v in enumerate(value))
    return value


@dataclass(frozen=True)
class _Leaf:
    index: int


def _rebuild(template: object, flat: tuple[object, ...]) -> object:
    if isinstance(template, _Leaf):
        return flat[template.index]
    if isinstance(template, dict):
        return {k: _rebuild(v, flat) for k, v in template.items()}
    if isinstance(template, (tuple, list)):
        return type(template)(_rebuild(v, flat) for v in template)
    return template


@contextlib.contextmanager
def _module_paths(layer: torch.nn.Module, layer_name: str) -> Iterator[None]:
    """While tracing, every node made inside a submodule's forward gets ``nn_module_stack``."""
    stack: list[tuple[str, str]] = []

    def publish() -> None:
        fx_traceback.get_current_meta()["nn_module_stack"] = {p: (p, t) for p, t in stack}

    def enter(path: str) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, _args: object) -> None:
            stack.append((path, type(mod).__qualname__))
            publish()
        return hook

    def leave(_mod: torch.nn.Module, _args: object, _out: object) -> None:
        if stack:
            stack.pop()
        publish()

    handles = []
    for name, sub in layer.named_modules():
        path = layer_name + (f".{name}" if name else "")
        handles.append(sub.register_forward_pre_hook(enter(path), prepend=True))
        handles.append(sub.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def trace_layer(module: torch.nn.Module, layer_name: str, call: LayerCall, hidden: torch.Tensor) -> LayerGraph:
    """The ATen graph of layer ``layer_name`` called as in ``call`` with ``hidden`` as its input (at
    a decode step, its cache's past as the inputs ``past.keys`` and ``past.values``)."""
    from ...backends.torchao.leaves import quantized_leaves

    layer = module.get_submodule(layer_name)
    with quantized_leaves(layer, layer_name) as quantized:  # torchao weights: one operator each
        return _trace(layer, layer_name, call, hidden, quantized)


def _trace(layer: torch.nn.Module, layer_name: str, call: LayerCall, hidden: torch.Tensor,
           quantized: QuantizedLeaves) -> LayerGraph:
    state = {k: v for k, v in {**dict(layer.named_parameters()), **dict(layer.named_buffers())}.items()
             if k not in quantized.names}
    names = list(state)
    paths = [f"param:{n}" for n in names] + ["hidden"]
    leaves: list[torch.Tensor] = [*state.values(), hidden]
    args_t = _flatten(call.rest_args, "args", paths, leaves)
    kwargs_t = _flatten(call.kwargs, "kwargs", paths, leaves)
    n = len(names)
    q_start = len(leaves)  # the quantized weights' inner tensors, after the call's own
    paths += quantized.paths
    leaves += quantized.inputs
    slot = call.cache
    if slot is not None:
        paths += ["past.keys", "past.values"]
        leaves += [slot.keys, slot.values]

    def layer_fn(*flat: torch.Tensor) -> object:
        if slot is not None:  # the cache as it was before the layer, holding the graph's past inputs
            slot.load(flat[-2], flat[-1])
        quantized.bind(flat, q_start)
        params = dict(zip(names, flat[:n]))
        args, kwargs = _rebuild(args_t, flat), _rebuild(kwargs_t, flat)
        with _SourceLines():
            if call.hidden_keyword:
                return torch.func.functional_call(layer, params, tuple(args), {**kwargs, "hidden_states": flat[n]})
            return torch.func.functional_call(layer, params, (flat[n], *args), kwargs)

    with _module_paths(layer, layer_name), fx_traceback.preserve_node_meta(), torch.no_grad():
        # the graph is of this one call on real values: data-dependent steps (a mixture of experts'
        # loop over the experts its tokens chose) are traced as this input takes them
        try:
            gm = make_fx(torch.func.functionalize(layer_fn, remove="mutations"),
                         _error_on_data_dependent_ops=False)(*leaves)
        finally:
            if slot is not None:  # no traced value left in the cache
                slot.load(slot.keys, slot.values)
    return LayerGraph(gm, layer_name, paths, leaves)


def node_module_path(node: torch.fx.Node) -> str:
    """The innermost ``nn.Module`` path the node was made in ("" when unknown)."""
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def node_source(node: torch.fx.Node) -> str:
    """``file.py:line`` of the innermost frame outside torch that made the node ("" when unknown)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    frames = [(f, ln) for f, ln, _, _ in _frames(trace)]
    if not frames:
        return ""
    f, ln = frames[-1]
    return f"{os.path.basename(f)}:{ln}"


def _frames(trace: str) -> list[tuple[str, int, str, str]]:
    """``(file, line, '', '')`` of each frame of a formatted stack trace."""
    out = []
    for line in trace.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            try:
                file_part, rest = line[6:].split('", line ', 1)
                lineno = int(rest.split(",", 1)[0])
            except ValueError:
                continue
            out.append((file_part, lineno, "", ""))
    return out


def is_cast(node: torch.fx.Node) -> bool:
    """A pure dtype/device conversion (``aten._to_copy`` and friends): no arithmetic of its own."""
    return node.op == "call_function" and node.target in _CASTS


_CASTS = {torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout,
          torch.ops.aten.to.device}


def map_float_dtypes(value: object, dtype: torch.dtype, only: torch.dtype | None = None) -> object:
    """``value`` (args or kwargs) with every floating ``torch.dtype`` (or only ``only``) replaced by ``dtype``."""
    if isinstance(value, torch.dtype):
        return dtype if value.is_floating_point and (only is None or value == only) else value
    if isinstance(value, dict):
        return {k: map_float_dtypes(v, dtype, only) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(map_float_dtypes(v, dtype, only) for v in value)
    return value


def run_graph(graph: LayerGraph, inputs: list[object], *, float64: bool = False) -> dict[str, object]:
    """Every node's value running ``graph`` on ``inputs`` (placeholder order), eagerly; with
    ``float64`` every floating dtype the graph names becomes float64 (the trusted run)."""
    env: dict[str, object] = {}
    it = iter(inputs)
    with torch.no_grad():
        for node in graph.gm.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = next(it)
            elif node.op == "get_attr":
                value = getattr(graph.gm, str(node.target))
                env[node.name] = value.double() if float64 and value.is_floating_point() else value
            elif node.op == "call_function":
                args = torch.fx.node.map_arg(node.args, lambda a: env[a.name])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: env[a.name])
                if float64:
                    args, kwargs = map_float_dtypes(args, torch.float64), map_float_dtypes(kwargs, torch.float64)
                env[node.name] = node.target(*args, **kwargs)
    return env
