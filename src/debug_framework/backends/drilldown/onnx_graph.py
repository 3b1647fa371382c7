"""ONNX graph surgery for the ONNX Runtime drill-down: every value an output, the graph in float64,
one node as a model of its own, and where a node came from (ATen op, ``nn.Module`` path, source line).

``torch.onnx.export(dynamo=True)`` (torch 2.13) names each node and records its origin in
``node.metadata_props``: ``pkg.torch.onnx.fx_node`` (the FX node, with its ATen target),
``pkg.torch.onnx.name_scopes`` (the module path, one scope per entry, the FX node's name last) and
``pkg.torch.onnx.stack_trace`` (the Python frames that emitted it, innermost last).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .paths import source_line

if TYPE_CHECKING:
    import onnx

__all__ = ["FLOAT_TYPES", "NodeOrigin", "node_origin", "value_infos", "value_types", "with_all_outputs", "to_float64",
           "single_node_model"]

#: ONNX element types judged numerically (float16, float, double, bfloat16).
FLOAT_TYPES = frozenset({1, 10, 11, 16})
_FLOAT, _DOUBLE = 1, 11
_TARGET = re.compile(r"target=(?:torch\.ops\.)?([A-Za-z_][\w.]*)")


@dataclass(frozen=True)
class NodeOrigin:
    """What the exporter says a node implements: the ATen overload, the module path (relative to
    the exported module), and the innermost source line (``file.py:123``); ``""`` when unknown."""

    aten: str = ""
    module_path: str = ""
    source: str = ""


def node_origin(node: onnx.NodeProto) -> NodeOrigin:
    """The origin torch.onnx's exporter recorded on ``node`` (an ``onnx.NodeProto``)."""
    props = {p.key: p.value for p in node.metadata_props}
    match = _TARGET.search(props.get("pkg.torch.onnx.fx_node", ""))
    aten = match.group(1) if match else ""
    module_path = ""
    try:
        scopes = ast.literal_eval(props.get("pkg.torch.onnx.name_scopes", "[]"))
    except (ValueError, SyntaxError):
        scopes = []
    if isinstance(scopes, list) and len(scopes) >= 2:
        module_path = str(scopes[-2])  # the last entry names the FX node itself
    return NodeOrigin(aten, module_path, source_line(props.get("pkg.torch.onnx.stack_trace")))


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """A typed ``ValueInfoProto`` (shape where ONNX shape inference knows it) of every value of
    ``model``'s graph: inputs, initializers and node outputs."""
    import onnx

    graph = onnx.shape_inference.infer_shapes(model).graph
    infos = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output) if v.type.HasField("tensor_type")}
    for init in graph.initializer:
        infos[init.name] = onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
    return infos


def value_types(infos: dict[str, onnx.ValueInfoProto]) -> dict[str, int]:
    """Element type of every value in ``infos`` (see :func:`value_infos`)."""
    return {name: info.type.tensor_type.elem_type for name, info in infos.items()}


def _info(infos: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    """A copy of the value info of ``name`` (shape kept: a checked model needs one)."""
    import onnx

    copy = onnx.ValueInfoProto()
    copy.CopyFrom(infos[name])
    return copy


def with_all_outputs(model: onnx.ModelProto, infos: dict[str, onnx.ValueInfoProto]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose outputs are every node output of known tensor type (graph order),
    and those names. Observing a value blocks the fusions that would consume it, so this runs
    ONNX Runtime's kernels one by one, as Polygraphy's mark-all does."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    declared = {o.name for o in out.graph.output}
    names = [name for node in out.graph.node for name in node.output if name and name in infos]
    for name in names:
        if name not in declared:
            out.graph.output.append(_info(infos, name))
    return out, names


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64: float32 initializers, inputs, outputs, value
    infos, ``Cast``/``CastLike`` targets and ``Constant`` tensors become double (integer and
    boolean values are kept)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for init in graph.initializer:
        if init.data_type == _FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == _FLOAT:
            value.type.tensor_type.elem_type = _DOUBLE
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == _FLOAT:
                attr.i = _DOUBLE
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == _FLOAT:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float64), attr.t.name))
    return out


def single_node_model(model: onnx.ModelProto, node: onnx.NodeProto, infos: dict[str, onnx.ValueInfoProto]) -> onnx.ModelProto:
    """``node`` alone as a model: each of its inputs a graph input, its outputs the graph's
    outputs, typed as in ``model`` (``infos``: :func:`value_infos`), with ``model``'s opsets and
    local functions."""
    import onnx

    inputs = [_info(infos, n) for n in dict.fromkeys(x for x in node.input if x)]
    outputs = [_info(infos, n) for n in node.output if n]
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    graph = onnx.helper.make_graph([copy], f"{node.name or node.op_type}", inputs, outputs)
    single = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    single.functions.extend(model.functions)
    return single
