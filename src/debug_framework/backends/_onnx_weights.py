"""The weights of an ONNX file as its graph runners hold them: taken out of the graph once, kept
as float32 arrays shared by every runner of the file in the process (the float64 reference, the
calibration's float32 runner, the precision diagnosis's float16 run), and fed to each session on
every run (:class:`FedSession`). A runner at float64 or float16 reads them through a ``Cast`` node
before their first reader (exact: float32 -> float64 loses nothing, and float32 -> float16 rounds as
converting the initializer would), so the float64 copy of a weight exists only while a run uses it.

Also here: :func:`numpy_stream`, one pass of ONNX's NumPy evaluator that yields the values asked
for, chunk by chunk, and drops every value after its last reader (the evaluator's own ``run`` keeps
them all until the end).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

if TYPE_CHECKING:
    import onnx
    from onnx.reference import ReferenceEvaluator

    from ._graph_session import GraphSession

#: A session :class:`FedSession` wraps: a runtime's, or ONNX's NumPy evaluator.
InnerSession = Union["GraphSession", "ReferenceEvaluator"]

__all__ = ["FED_BYTES", "split_weights", "FileWeights", "file_weights", "light_graph", "cast_on_use", "FedSession",
           "numpy_stream", "run_streamed"]

_FLOAT, _FLOAT16, _DOUBLE = 1, 10, 11
#: Initializers above this many bytes are held once as arrays and fed (:func:`split_weights`).
FED_BYTES = 4096
#: The suffix of a graph input that feeds a float32 weight to its ``Cast`` (:func:`cast_on_use`).
CAST_SUFFIX = "__f32"


def split_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``model`` (data loaded) without its large floating-point initializers: a new, light
    ``onnx.ModelProto`` where each is a graph input of its type and shape, and their data as arrays.
    A runner holds its weights so once, and feeds the same arrays to its full graph and to every
    layer cut of it (:class:`FedSession`), instead of one copy per session plus the model's own.
    (A new model, not ``model`` edited: a protobuf message's removed fields keep their memory until
    the whole message is freed.)"""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights: dict[str, np.ndarray] = {}
    kept, fed = [], []
    declared = {i.name for i in graph.input}  # an initializer listed as a graph input (IR < 4) stays
    for t in graph.initializer:
        if (t.data_type in (_FLOAT, _FLOAT16, _DOUBLE) and t.name not in declared
                and t.data_location != 1 and len(t.raw_data) > FED_BYTES):
            weights[t.name] = numpy_helper.to_array(t)
            fed.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            kept.append(t)
    light = helper.make_model(
        helper.make_graph(list(graph.node), graph.name, [*graph.input, *fed], list(graph.output),
                          initializer=kept, value_info=list(graph.value_info)),
        ir_version=model.ir_version, opset_imports=list(model.opset_import), producer_name=model.producer_name,
        functions=list(model.functions))
    light.metadata_props.extend(model.metadata_props)
    return light, weights


class FileWeights(dict):  # type: ignore[type-arg]
    """The large initializers of one ONNX file as arrays (name -> array, the file's types), and
    :attr:`light`, the file's graph without them (serialized): what every runner of the file
    starts from. Held by the runners; shared while one holds it (:func:`file_weights`)."""

    light: bytes = b""


#: (resolved path, mtime, size) -> the file's weights, while a runner holds them
_SHARED: weakref.WeakValueDictionary[tuple[str, int, int], FileWeights] = weakref.WeakValueDictionary()


def _key(path: Path) -> tuple[str, int, int]:
    st = Path(path).stat()
    return (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def light_graph(path: Path) -> onnx.ModelProto:
    """The ONNX file ``path``'s graph (an ``onnx.ModelProto``) for reading its nodes: without its
    large initializers where a runner holds the file's weights (:func:`file_weights`), else read
    whole (external data left out)."""
    import onnx

    got = _SHARED.get(_key(path))
    if got is not None:
        return onnx.load_from_string(got.light)
    return onnx.load(str(path), load_external_data=False)


def file_weights(path: Path) -> FileWeights:
    """The weights of the ONNX file ``path`` (external data read in), read once while any runner
    holds them: a second runner of the same unchanged file gets the same arrays."""
    import onnx

    key = _key(path)
    got = _SHARED.get(key)
    if got is None:
        light, arrays = split_weights(onnx.load(str(path), load_external_data=True))
        got = FileWeights(arrays)
        got.light = light.SerializeToString()
        del light
        _SHARED[key] = got
    return got


def cast_on_use(model: onnx.ModelProto, weights: Mapping[str, np.ndarray], elem: int, through: int | None = None
                ) -> dict[str, np.ndarray]:
    """``model`` (its fed weights' inputs already retyped to ``elem``) made to take each float32
    array of ``weights`` as it is: the input renamed ``<name>__f32`` and typed float32, a ``Cast`` to
    ``elem`` making ``<name>`` right before its first reader, in place (``through``: by way of that
    type, a ``Cast`` pair: bfloat16 rounding kept in float32). Returns the feeds (input name -> the
    same arrays, none copied)."""
    from onnx import helper

    graph = model.graph
    feeds: dict[str, np.ndarray] = {}
    casts = []
    for vi in graph.input:
        a = weights.get(vi.name)
        if a is None:
            continue
        if a.dtype == np.float32 and vi.type.tensor_type.elem_type == elem:
            name = vi.name
            vi.name = f"{name}{CAST_SUFFIX}"
            vi.type.tensor_type.elem_type = _FLOAT
            if through is None:
                casts.append(helper.make_node("Cast", [vi.name], [name], to=elem, name=f"{name}__cast"))
            else:
                casts.append(helper.make_node("Cast", [f"{name}__via"], [name], to=elem, name=f"{name}__cast"))
                casts.append(helper.make_node("Cast", [vi.name], [f"{name}__via"], to=through, name=f"{name}__via"))
            feeds[vi.name] = a
        else:
            feeds[vi.name] = a
    if casts:  # each Cast right before the first node that reads its value (its copy made late)
        by_value = {c.output[0]: c for c in casts}
        nodes = []

        def place(value: str) -> None:  # the Cast making ``value``, after the one it reads
            cast = by_value.pop(value, None)
            if cast is not None:
                place(cast.input[0])
                nodes.append(cast)

        for node in graph.node:
            for x in _reads(node):
                place(x)
            nodes.append(node)
        body, nodes = nodes, []
        for value in list(by_value):  # read by no node (a graph output): first
            place(value)
        nodes.extend(body)
        del graph.node[:]
        graph.node.extend(nodes)
    return feeds


class FedSession:
    """A session (ONNX Runtime's, or ONNX's NumPy evaluator) whose weights are graph inputs, fed on
    every run from the arrays :func:`split_weights` took out (shared, never copied). The NumPy
    evaluator runs streamed (:func:`run_streamed`): a value is dropped after its last reader."""

    def __init__(self, inner: InnerSession, weights: Mapping[str, np.ndarray]) -> None:
        self.inner = inner
        declared = set(inner.input_names) if hasattr(inner, "rt_nodes_") else {i.name for i in inner.get_inputs()}
        self.weights = {k: v for k, v in weights.items() if k in declared}

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The inner session's run of ``names`` on ``feeds`` and the weights."""
        if hasattr(self.inner, "rt_nodes_"):
            return run_streamed(self.inner, {**feeds, **self.weights}, names)
        return self.inner.run(names, {**feeds, **self.weights})


def run_streamed(evaluator: ReferenceEvaluator, feeds: Mapping[str, np.ndarray], names: list[str] | None
                 ) -> list[np.ndarray]:
    """ONNX's NumPy evaluator's outputs ``names`` (``None``: the graph's) on ``feeds``, computed in
    one :func:`numpy_stream` pass (each value dropped after its last reader)."""
    wanted = list(names) if names else list(evaluator.output_names)
    if not wanted:
        return []
    got = next(numpy_stream(evaluator, feeds, [list(dict.fromkeys(wanted))]))
    return [got[n] for n in wanted]


def _reads(node: onnx.NodeProto) -> list[str]:
    """The value names a ``NodeProto`` reads: its inputs and what its subgraphs read."""
    if node is None:
        return []
    names = [x for x in node.input if x]
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else list(attr.graphs)):
            for inner in graph.node:
                names.extend(_reads(inner))
    return names


def numpy_stream(evaluator: ReferenceEvaluator, feeds: Mapping[str, np.ndarray], chunks: list[list[str]]
                 ) -> Iterator[dict[str, np.ndarray]]:
    """The values of ``chunks`` (topological order), one chunk at a time, from one pass of ONNX's
    NumPy evaluator over its nodes: each value dropped after its last reader."""
    reads = [set(_reads(getattr(node, "onnx_node", None)) or node.input) for node in evaluator.rt_nodes_]
    last_use: dict[str, int] = {}
    for i, names in enumerate(reads):
        for x in names:
            last_use[x] = i
    wanted = {n for chunk in chunks for n in chunk}
    fixed = {**evaluator.rt_inits_, **feeds}
    results: dict[str, np.ndarray | None] = {"": None, **fixed}
    ready: dict[str, np.ndarray] = {n: fixed[n] for n in wanted if n in fixed}  # asked for, made by no node
    pending = iter(chunks)
    current = next(pending, None)
    while current is not None and all(n in ready for n in current):
        yield {n: ready.pop(n) for n in current}
        current = next(pending, None)
    for i, node in enumerate(evaluator.rt_nodes_):
        args = [results[x] for x in node.input]
        outs = node.run(*args, context=results) if node.need_context() else node.run(*args)
        for name, value in zip(node.output, outs):
            if name in wanted:
                ready[name] = value
            if last_use.get(name, -1) > i:  # a later node reads it
                results[name] = value
        del args, outs
        for x in reads[i]:
            if last_use.get(x) == i and x not in fixed:
                results.pop(x, None)
        while current is not None and all(n in ready for n in current):
            yield {n: ready.pop(n) for n in current}
            current = next(pending, None)
