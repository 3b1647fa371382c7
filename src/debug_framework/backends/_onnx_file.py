"""The graph of an ONNX-file model (:mod:`debug_framework.modelio.onnx_file`) as the backends run it:
its checkpoint tensors made graph outputs, and, for the reference, every float32 value of the graph
made float64 (initializers, constants, graph inputs and outputs, ``Cast``-to-float nodes).

An operator ONNX Runtime has no float64 kernel for is named in the error (DF002), never silently
run at float32.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..capture.keys import Capture, CheckpointKey, layer_input_key
from ..errors import BackendInitializationError
from ._graph_session import GraphSession, LayerExport

if TYPE_CHECKING:
    import onnx
    from onnx.reference import ReferenceEvaluator

    from ..modelio.inputs import ModelInputs
    from ..modelio.loader import LoadedModel
    from ._onnx_weights import FileWeights
    from .base import BaseBackend, HiddenState
from ._onnx_weights import FedSession, cast_on_use, file_weights, split_weights

__all__ = ["value_types", "exact_ops", "saturating_rmse", "alternative_model", "file_outputs", "checkpoint_graph", "checkpoint_proto", "add_outputs", "to_float64", "retype_floats", "Float64GraphRunner", "FedSession", "split_weights", "runner_graph", "checkpoint_names", "tensor_names", "float16_output_conflicts", "float16_cast_conflicts",
           "float16_conflicts_text", "load_error"]

_FLOAT, _FLOAT16, _DOUBLE = 1, 10, 11
#: a runner's dtype -> the ONNX element type every float32 value of the graph is made
_RETYPE = {"float64": _DOUBLE, "float16": _FLOAT16}
_NUMPY = {_DOUBLE: np.float64, _FLOAT16: np.float16}
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'")


def _plain_session(graph: bytes) -> tuple[GraphSession, str]:
    """A session on ``graph`` (serialized) computing it as written, in the engine the registry names
    for ONNX files (:func:`~debug_framework.backends.registry.graph_runtime`): ``(session, engine)``;
    the engine's own exception when it cannot open it (e.g. no kernel of that precision)."""
    from .registry import graph_runtime

    engine, opener = graph_runtime("onnx")
    return opener(graph), engine


def runner_graph(path: Path, tensors: list[str], dtype: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], FileWeights]:
    """:func:`checkpoint_proto` with its large weights taken out (:func:`~._onnx_weights.file_weights`,
    float32 arrays shared by every runner of the file): ``(the light graph at dtype, its feeds, the
    shared weights)``. At float64 or float16 the graph casts each float32 weight on use
    (:func:`~._onnx_weights.cast_on_use`), at bfloat16 rounds it on use the same way."""
    import onnx

    shared = file_weights(path)
    light = onnx.load_from_string(shared.light)
    proto = _at_dtype(light, dtype, tensors)  # the fed weights' inputs retyped too
    if dtype in _RETYPE:
        return proto, cast_on_use(proto, shared, _RETYPE[dtype]), shared
    if dtype == "bfloat16":  # rounded on use (a Cast pair through bfloat16: as _bf16_round rounds)
        return proto, cast_on_use(proto, shared, _FLOAT, through=16), shared
    return proto, dict(shared), shared


def checkpoint_names(model: LoadedModel) -> dict[CheckpointKey, str]:
    """The model's checkpoints (keys) -> graph tensor names."""
    return {CheckpointKey.parse(k): v for k, v in model.config.checkpoint_tensors.items()}


def tensor_names(path: Path) -> set[str]:
    """Every tensor name of the ONNX file ``path``: graph inputs, initializers, node outputs."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    return {i.name for i in g.input} | {o for n in g.node for o in n.output}


def alternative_model(path: str | Path | None, backend: str) -> Path | None:
    """``model_file``, checked: an existing ``.onnx`` file (DF002 otherwise)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.suffix.lower() != ".onnx" or not p.is_file():
        raise BackendInitializationError(f"the alternative model {str(p)!r} is not an existing .onnx file",
                                         backend=backend)
    return p


#: ONNX's floating element types -> the framework's dtype names
_ELEM_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}


def weights_dtype(path: Path) -> str | None:
    """The floating dtype most of the ONNX file ``path``'s weights (initializers, by element count)
    are stored in: what a converted file computes at (``float16`` for a file converted by
    onnxconverter-common); None where it has no floating weights. Reads the graph, not the external
    data."""
    import onnx

    counts: dict[str, int] = {}
    for t in onnx.load(str(path), load_external_data=False).graph.initializer:
        name = _ELEM_DTYPES.get(int(t.data_type))
        if name is not None:
            n = 1
            for d in t.dims:
                n *= int(d)
            counts[name] = counts.get(name, 0) + n
    return max(counts, key=lambda k: counts[k]) if counts else None


def file_outputs(model: LoadedModel, model_file: Path | None) -> tuple[Path, dict[CheckpointKey, str]]:
    """The file an alternative runs (``model_file``, else the model's own) and its checkpoints ->
    tensor names, matched by name: a checkpoint the file lacks is left out (reported missing)."""
    names = checkpoint_names(model)
    if model_file is None:
        return model.path, names
    present = tensor_names(model_file)
    return model_file, {k: v for k, v in names.items() if v in present}


def _retyped_tensor(t: onnx.TensorProto, elem: int) -> onnx.TensorProto:
    from onnx import numpy_helper

    if t.data_type != _FLOAT:
        return t
    with np.errstate(over="ignore"):  # beyond float16's range is ±inf, as the engine makes it; judged as saturated
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(_NUMPY[elem]), t.name)


def retype_floats(model: onnx.ModelProto, elem: int) -> onnx.ModelProto:
    """``model`` (an ``onnx.ModelProto`` with its data loaded) with every float32 value made ``elem``
    (float64 or float16) in place: initializers, constants, graph inputs and outputs, ``Cast``-to-float."""
    from onnx import helper, numpy_helper

    graph = model.graph
    for i, t in enumerate(list(graph.initializer)):
        if t.data_type == _FLOAT:
            graph.initializer[i].CopyFrom(_retyped_tensor(t, elem))
    for vi in list(graph.input) + list(graph.output):
        if vi.type.tensor_type.elem_type == _FLOAT:
            vi.type.tensor_type.elem_type = elem
    del graph.value_info[:]
    for node in graph.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == _FLOAT:
                a.i = elem
            elif a.type == a.TENSOR and a.t.data_type == _FLOAT:
                a.t.CopyFrom(_retyped_tensor(a.t, elem))
            elif node.op_type == "Constant" and a.name in ("value_float", "value_floats"):
                vals = np.asarray(a.f if a.name == "value_float" else list(a.floats), dtype=_NUMPY[elem])
                node.attribute.remove(a)
                node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(vals)))
                break
    return model


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float32 value made float64, in place (:func:`retype_floats`)."""
    return retype_floats(model, _DOUBLE)


def _bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 ``a`` rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isfinite(a), rounded.view(np.float32), a).astype(np.float32)


def round_to_bfloat16(model: onnx.ModelProto, types: dict[str, int]) -> onnx.ModelProto:
    """``model`` (float32) as a correct bfloat16 run computes it, in place: float32 weights and
    constants rounded to bfloat16, and every float32 value a node makes rounded to bfloat16 by a
    ``Cast`` pair after it (ONNX Runtime computes each op in float32 on bfloat16 inputs)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    for t in graph.initializer:
        if t.data_type == _FLOAT:
            t.CopyFrom(numpy_helper.from_array(_bf16_round(numpy_helper.to_array(t)), t.name))
    outputs = {o.name for o in graph.output}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for a in node.attribute:
            if a.type == a.TENSOR and a.t.data_type == _FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(_bf16_round(numpy_helper.to_array(a.t)), a.t.name))
        for k, out in enumerate(node.output):
            if out and (types.get(out) == _FLOAT or (out in outputs and out not in types)) and node.op_type != "Constant":
                raw = f"{out}__f32"
                node.output[k] = raw
                nodes.append(helper.make_node("Cast", [raw], [f"{out}__bf16"], to=16, name=f"{out}__to_bf16"))
                nodes.append(helper.make_node("Cast", [f"{out}__bf16"], [out], to=_FLOAT, name=f"{out}__from_bf16"))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return model


def checkpoint_graph(path: Path, tensors: list[str], *, dtype: str = "float32") -> bytes:
    """The ONNX file ``path`` (external data read in) with ``tensors`` as extra graph outputs,
    serialized; ``dtype`` float64 or float16: every float32 value made so first."""
    return checkpoint_proto(path, tensors, dtype=dtype).SerializeToString()


def checkpoint_proto(path: Path, tensors: list[str], *, dtype: str = "float32") -> onnx.ModelProto:
    """:func:`checkpoint_graph` as an ``onnx.ModelProto`` (not serialized)."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    return _at_dtype(model, dtype, tensors)


def _at_dtype(model: onnx.ModelProto, dtype: str, tensors: list[str]) -> onnx.ModelProto:
    """``model`` made ``dtype`` in place (retyped, or rounded to bfloat16), ``tensors`` added as outputs."""
    if dtype in _RETYPE:
        retype_floats(model, _RETYPE[dtype])
    elif dtype == "bfloat16":
        round_to_bfloat16(model, value_types(model))
    add_outputs(model, tensors, value_types(model), _RETYPE.get(dtype, _FLOAT))
    return model


def add_outputs(model: onnx.ModelProto, tensors: list[str], types: dict[str, int], default: int) -> int:
    """``tensors`` appended to ``model``'s graph outputs (those not outputs already), typed by
    ``types`` (else ``default``); returns how many outputs the graph had before."""
    from onnx import helper

    before = len(model.graph.output)
    present = {o.name for o in model.graph.output}
    for name in tensors:
        if name not in present:
            model.graph.output.append(helper.make_tensor_value_info(name, types.get(name) or default, None))
            present.add(name)
    return before


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """The ONNX element type of every value of ``model`` shape inference finds (``{}`` where it
    fails), inferred on a copy without the data of its large initializers (their dims and types
    kept as graph inputs), so a model's weights are neither copied nor serialized for it."""
    import onnx
    from onnx import helper

    graph = model.graph
    light = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    small = [t for t in graph.initializer if len(t.raw_data) <= 4096 and t.data_location != 1]
    large = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer
             if len(t.raw_data) > 4096 or t.data_location == 1]
    light.graph.CopyFrom(helper.make_graph(list(graph.node), graph.name, [*graph.input, *large],
                                           list(graph.output), initializer=small, value_info=list(graph.value_info)))
    try:
        inferred = onnx.shape_inference.infer_shapes(light).graph
    except Exception:  # noqa: BLE001 - shape inference is only a help for the values' types
        return {}
    return {vi.name: vi.type.tensor_type.elem_type for vi in (*inferred.value_info, *inferred.output)}


def no_kernel_error(exc: Exception, backend: str, path: Path) -> BackendInitializationError:
    """ONNX Runtime's refusal of a float64 graph, naming the operator it has no float64 kernel for."""
    m = _NO_KERNEL.search(str(exc))
    if m:
        return BackendInitializationError(
            f"ONNX Runtime cannot run {path.name} so: it has no kernel of that precision for the "
            f"{m.group(1)} operator (node {m.group(2)!r})", backend=backend,
            hint="validate with a float32 reference (reference_dtype float32) or replace the operator")
    return BackendInitializationError(f"ONNX Runtime could not load the retyped graph of {path.name}: {exc}",
                                      backend=backend)


def float16_output_conflicts(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Graph outputs of ``model`` made by a ``Cast`` to float32 that nodes inside the graph read as
    well -> those nodes: what ``onnxconverter_common``'s float16 conversion with the float32
    outputs kept (``keep_io_types=True``) leaves when an output is also read inside the graph (a
    BERT's last hidden state, read by its pooler): the readers were converted to float16 but now
    read the float32 cast (a reader declared to make float16), and ONNX Runtime refuses the file."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    declared = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
    conflicts: dict[str, list[str]] = {}
    for out in graph.output:
        made = producer.get(out.name)
        if made is None or made.op_type != "Cast" or not any(a.name == "to" and a.i == _FLOAT for a in made.attribute):
            continue
        readers = [n.name or n.op_type for n in graph.node if out.name in n.input  # a reader left in float16
                   and any(declared.get(o) == _FLOAT16 for o in n.output)]
        if readers:
            conflicts[out.name] = readers
    return conflicts


def float16_cast_conflicts(model: onnx.ModelProto) -> dict[str, str]:
    """``Cast`` nodes of ``model`` that make float32 where the graph declares their output float16
    -> the node's name: what ``onnxconverter_common``'s float16 conversion leaves of a cast to
    float32 inside the graph (torch.onnx's ``_to_copy`` of the rotary positions in a Llama export):
    it retypes the value but keeps the cast, and ONNX Runtime refuses the file (keyed by the value)."""
    graph = model.graph
    declared = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
    found: dict[str, str] = {}
    for n in graph.node:
        if n.op_type != "Cast" or not n.output or not n.output[0]:
            continue
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        if to == _FLOAT and declared.get(n.output[0]) == _FLOAT16:
            found[n.output[0]] = n.name or n.op_type
    return found


def float16_conflicts_text(model: onnx.ModelProto) -> tuple[str, str] | None:
    """``(what, fix)`` for every float16 conversion breakage of ``model`` that ONNX Runtime refuses
    (:func:`float16_output_conflicts`, :func:`float16_cast_conflicts`), in words, with the
    conversion that avoids all of them; None where there is none."""
    outputs, casts = float16_output_conflicts(model), float16_cast_conflicts(model)
    if not outputs and not casts:
        return None
    what, block = [], []
    if outputs:
        said = "; ".join(f"{o!r} (read by {', '.join(repr(r) for r in rs[:3])})" for o, rs in outputs.items())
        what.append(f"its output {said} is cast back to float32 while nodes inside the graph still read it: "
                    "what a float16 conversion that keeps the float32 outputs (keep_io_types=True) makes of an "
                    "output the graph also reads")
        block += [r for rs in outputs.values() for r in rs]
    if casts:
        said = ", ".join(f"{node!r} (making {value!r})" for value, node in list(casts.items())[:3])
        what.append(f"its Cast node(s) {said} still make float32 where the conversion declared float16: a float16 "
                    "conversion keeps a cast to float32 inside the graph (an exporter's _to_copy)")
        block += list(casts.values())
    nodes = ", ".join(repr(b) for b in dict.fromkeys(block))
    fix = (f"convert again with those nodes kept in float32: convert_float_to_float16(model, keep_io_types=True, "
           f"node_block_list=[{nodes}])")
    if outputs and not casts:
        fix = "convert with keep_io_types=False, or " + fix[0].lower() + fix[1:]
    return "; ".join(what), fix


def load_error(exc: Exception, path: Path, graph: bytes | None, backend: str,
               source: Path | None = None) -> BackendInitializationError:
    """ONNX Runtime's refusal to load the file ``path`` (or ``graph``, a serialized model of it),
    explained where it is a float16 conversion's known breakage (:func:`float16_conflicts_text`).
    ``source``: the user's file that ``path`` is the tool's checkpoint copy of; the error names it
    and looks for the breakage in it."""
    import onnx

    refused = str(exc).rstrip(". ")
    copy = "" if source is None or source == path else f" (its checkpoint copy {path.name})"
    message = f"ONNX Runtime could not load {source or path}{copy}: {refused}"
    try:
        if source is not None:
            proto = onnx.load(str(source), load_external_data=False)
        else:
            proto = onnx.load_from_string(graph) if graph is not None else onnx.load(str(path), load_external_data=False)
        found = float16_conflicts_text(proto)
    except Exception:  # noqa: BLE001 - only an explanation of an error already raised
        found = None
    if found is not None:
        what, fix = found
        return BackendInitializationError(f"{message}. In {(source or path).name}, {what}", backend=backend, hint=fix)
    if source is not None:  # the user's file itself: not a backend that cannot run here
        return BackendInitializationError(message, backend=backend, hint=(
            f"open {source.name} itself in the runtime's own API (an inference session of {str(source)!r}); "
            "if it does not load there either, the file needs fixing or converting again"))
    return BackendInitializationError(message, backend=backend)


class Float64GraphRunner:
    """The reference's run of an ONNX-file model: the same graph in float64 (or float32; or float16,
    or bfloat16 rounding every value a node makes: the precision diagnosis's correct runs) in ONNX
    Runtime, else in ONNX's NumPy evaluator."""

    def __init__(self, model: LoadedModel, dtype: str, backend: str) -> None:
        self.model, self.dtype, self.backend = model, dtype, backend
        self.names = checkpoint_names(model)
        #: the checkpoint graph (weights at ``dtype``): what :meth:`replay` cuts layers out of and
        #: :meth:`marked` marks; one copy of the weights beside the session's own (never the bytes too)
        #: the weights at ``dtype``, held once: fed to the session and every cut (:class:`FedSession`)
        self._proto, self._weights, self._shared = runner_graph(model.path, list(self.names.values()), dtype)
        perturb = getattr(model.weights, "perturb_array", None)  # the validation's noise rule: weights moved
        if callable(perturb):
            self._weights = {k: perturb(k, v) for k, v in self._weights.items()}
        self._cuts: dict[tuple[int, str], tuple[onnx.ModelProto, str, set[str], FedSession | None]] = {}
        self._marked: list[str] = []
        #: the engine that runs ONNX files (the registry's), or "onnx.reference" (NumPy) where it lacks a
        #: kernel of this precision
        self.fallback_reason: str | None = None
        try:
            inner, self.runtime = _plain_session(self._proto.SerializeToString())
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
            err = no_kernel_error(exc, backend, model.path)
            if not _NO_KERNEL.search(str(exc)):
                raise err from exc
            inner, self.runtime, self.fallback_reason = _numpy_proto_session(self._proto, err, backend), \
                "onnx.reference", str(err)
        self.session: FedSession = FedSession(inner, self._weights)

    def marked(self, tensors: list[str]) -> FedSession:
        """This runner's session with ``tensors`` (values of its graph) among its outputs as well:
        the mark-all comparison's run of the graph at this runner's dtype. In ONNX Runtime the
        session is replaced by one on the same graph with those outputs marked (its checkpoint runs
        compute the same values: the graph as written, nothing fused), so no second copy of the
        weights is made; ONNX's NumPy evaluator walks every node already and is returned as is."""
        if self.runtime == "onnx.reference" or set(tensors) <= set(self._marked):
            return self.session
        before = add_outputs(self._proto, tensors, value_types(self._proto), _RETYPE.get(self.dtype, _FLOAT))
        try:
            graph = self._proto.SerializeToString()
        finally:
            del self._proto.graph.output[before:]  # the cuts keep the checkpoint outputs only
        self.session = FedSession(_plain_session(graph)[0], self._weights)
        self._marked = list(tensors)
        return self.session

    @staticmethod
    def open_marked(path: Path, tensors: list[str], dtype: str, backend: str,
                    runtime: str | None = None) -> tuple[GraphSession, str]:
        """The graph of ``path`` at ``dtype`` with ``tensors`` as its outputs, opened as the runner
        opens its own (ONNX Runtime, the graph as written; else ONNX's NumPy evaluator where ONNX
        Runtime lacks a kernel of that precision; ``runtime="onnx.reference"``: a runner of the same
        graph found so already): ``(session, runtime)``."""
        graph = checkpoint_graph(path, tensors, dtype=dtype)
        if runtime == "onnx.reference":
            err = BackendInitializationError(f"ONNX Runtime has no {dtype} kernel for an operator of {path.name}",
                                             backend=backend)
            return _numpy_session(graph, err, backend), runtime
        try:
            return _plain_session(graph)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
            err = no_kernel_error(exc, backend, path)
            if not _NO_KERNEL.search(str(exc)):
                raise err from exc
            return _numpy_session(graph, err, backend), "onnx.reference"

    def _open(self, cut: onnx.ModelProto) -> FedSession:
        """A session on ``cut`` (an ``onnx.ModelProto``) in the runtime :meth:`run` uses (ONNX
        Runtime, else the NumPy evaluator)."""
        if self.runtime == "onnx.reference":
            return FedSession(_numpy_proto_session(cut, BackendInitializationError(self.fallback_reason or "",
                                                                                   backend=self.backend), self.backend),
                              self._weights)
        return FedSession(_plain_session(cut.SerializeToString())[0], self._weights)

    def replay(self, i: int, part: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Layer ``i`` (``part="layer"``: from its input, to its checkpoints) or its MLP block
        (``"mlp"``: from ``post_attention:i`` to ``post_mlp:i``) of the graph alone on ``hidden_in``,
        cut out of the checkpoint graph at the layer's boundaries (:func:`~._onnx_graph.cut_layer`;
        built once per layer and part); ``hidden_in`` rounded once to the graph's precision.

        Raises:
            BackendInitializationError: the graph cannot be cut so (DF002).
        """
        from ..modelio.onnx_file import onnx_feeds
        from ._onnx_graph import LayerCutError, cut_layer

        keys = layer_cut_keys(self.names, i, part)
        if (i, part) not in self._cuts:
            for other in [k for k in self._cuts if k[0] != i]:  # one layer's cuts held at a time
                del self._cuts[other]
            start = CheckpointKey("post_attention", i) if part == "mlp" else layer_input_key(i)
            if start not in self.names or not keys:
                raise BackendInitializationError(f"layer {i}'s boundaries are not tensors of {self.model.path.name}",
                                                 backend=self.backend)
            try:
                cut = cut_layer(self._proto, self.names[start],
                                [self.names[k] for k in keys], list(self.names.values()))
            except LayerCutError as exc:
                raise BackendInitializationError(f"layer {i} cannot be cut out of {self.model.path.name}: {exc}",
                                                 backend=self.backend) from exc
            elem = cut.graph.input[0].type.tensor_type.elem_type
            self._cuts[(i, part)] = (self._open(cut), cut.graph.input[0].name,
                                     {i.name for i in cut.graph.input}, _NUMPY.get(elem, np.float32))
        session, hidden_name, wanted, np_type = self._cuts[(i, part)]
        hidden = np.asarray(hidden_in, dtype=np.float64)
        with np.errstate(over="ignore"):  # a hidden state beyond float16's range is ±inf there (saturated)
            hidden = _bf16_round(hidden.astype(np.float32)) if self.dtype == "bfloat16" else hidden.astype(np_type)
        feeds = {k: v for k, v in onnx_feeds(self.model.config, inputs).items() if k in wanted}
        feeds[hidden_name] = np.ascontiguousarray(hidden)
        start_t = time.perf_counter()
        arrays = session.run([self.names[k] for k in keys], feeds)
        return Capture(tensors={k: np.asarray(a) for k, a in zip(keys, arrays)}, backend=self.backend,
                       dtype=self.dtype, elapsed_s=time.perf_counter() - start_t,
                       meta={"variant": f"layer {i}" if part == "layer" else f"mlp block {i}", "replay": "graph",
                             "runtime": self.runtime})

    def block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` of layer ``i`` alone on its input: ``"mlp"`` its cut from
        ``post_attention:i``; ``"attention"`` the layer's cut, its ``post_attention:i``."""
        if block == "mlp":
            return self.replay(i, "mlp", hidden_in, inputs)
        cap = self.replay(i, "layer", hidden_in, inputs)
        key = CheckpointKey("post_attention", i)
        if key not in cap.tensors:
            raise BackendInitializationError(f"layer {i} of {self.model.path.name} has no post-attention tensor",
                                             backend=self.backend)
        cap.tensors = {key: cap.tensors[key]}
        return cap

    def release_replays(self) -> None:
        """Drop the layer cuts' sessions (built again when a layer is replayed once more)."""
        self._cuts.clear()

    def can_replay(self, part: str) -> tuple[bool, str]:
        """Whether every layer's ``part`` (``"layer"`` or ``"mlp"``) has its boundaries among the checkpoints."""
        for i in range(self.model.num_layers):
            start = CheckpointKey("post_attention", i) if part == "mlp" else layer_input_key(i)
            if start not in self.names or not layer_cut_keys(self.names, i, part):
                what = "layer" if part == "layer" else "MLP block"
                return False, f"cannot cut layer {i}'s {what} out of the graph: its input {start} is not found"
        return True, ""

    def run(self, inputs: ModelInputs, keys: list[CheckpointKey], capture_layer_inputs: bool) -> Capture:
        from ..modelio.onnx_file import onnx_feeds

        from ._graph_feeds import layer_inputs_from

        wanted = [k for k in keys if k in self.names]
        if capture_layer_inputs:
            wanted += [k for k in self.names if k.name in ("post_embedding", "post_mlp") and k not in wanted]
        start = time.perf_counter()
        arrays = self.session.run([self.names[k] for k in wanted], onnx_feeds(self.model.config, inputs))
        elapsed = time.perf_counter() - start
        got = {k: np.asarray(a) for k, a in zip(wanted, arrays)}
        return Capture(tensors={k: got[k] for k in keys if k in got}, backend=self.backend, dtype=self.dtype,
                       elapsed_s=elapsed,
                       layer_inputs=layer_inputs_from(got, self.model.num_layers) if capture_layer_inputs else {},
                       meta={"variant": "onnx-file", "onnx_path": str(self.model.path), "runtime": self.runtime,
                             **({"fallback_reason": self.fallback_reason} if self.fallback_reason else {})})


def layer_cut_keys(names: dict[CheckpointKey, str], i: int, part: str) -> list[CheckpointKey]:
    """The checkpoints a cut of layer ``i`` computes: ``part="mlp"`` its ``post_mlp:i``; ``"layer"``
    its ``post_attention:i`` (where the graph has one) and ``post_mlp:i``."""
    wanted = [CheckpointKey("post_mlp", i)] if part == "mlp" else [CheckpointKey("post_attention", i),
                                                                    CheckpointKey("post_mlp", i)]
    return [k for k in wanted if k in names]


def saturating_rmse(reference: np.ndarray, value: np.ndarray, big: float) -> float:
    """RMSE of ``value`` against ``reference`` (both float64, same positions); ``inf`` where a
    non-finite value does not match (NaN matches NaN; a value saturated in the alternative's type,
    at least half its largest finite value or infinite, matches a reference beyond that range of the
    same sign)."""
    saturated = (np.abs(reference) >= big) & (np.abs(value) >= big / 2) & (np.sign(reference) == np.sign(value))
    finite = np.isfinite(reference) & np.isfinite(value) & ~saturated
    matched = saturated | (np.isnan(reference) & np.isnan(value)) | (
        np.isinf(reference) & np.isinf(value) & (np.sign(reference) == np.sign(value)))
    if (~finite & ~matched).any():
        return math.inf
    if not finite.any():
        return 0.0
    diff = value[finite] - reference[finite]
    return float(np.sqrt(np.mean(diff * diff)))


def exact_ops() -> list[type]:
    """Operators ONNX's NumPy reference evaluator computes below float64 precision, made exact at
    the input's dtype (its ``new_ops``): ``Erf`` (there ``math.erf`` rounded through float32, so
    ``Gelu``, defined with it, too)."""
    from onnx.reference.ops._op import OpRunUnaryNum

    try:
        from scipy.special import erf as _erf
    except ImportError:  # scipy is optional: math.erf element by element, in float64
        import math

        _erf = np.vectorize(math.erf, otypes=[np.float64])

    class Erf(OpRunUnaryNum):
        def _run(self, x: np.ndarray) -> tuple[np.ndarray]:  # type: ignore[override]
            return (np.asarray(_erf(np.asarray(x, dtype=np.float64))).astype(x.dtype),)

    return [Erf]


def _numpy_session(graph: bytes, err: BackendInitializationError, backend: str) -> ReferenceEvaluator:
    """The float64 graph in ONNX's NumPy reference evaluator (every operator in float64); ``err``
    (naming the operator ONNX Runtime lacks) is raised when that cannot run it either."""
    import onnx

    return _numpy_proto_session(onnx.load_from_string(graph), err, backend)


def _numpy_proto_session(proto: onnx.ModelProto, err: BackendInitializationError, backend: str) -> ReferenceEvaluator:
    """:func:`_numpy_session` on an ``onnx.ModelProto``."""
    from onnx.reference import ReferenceEvaluator

    try:
        return ReferenceEvaluator(proto, new_ops=exact_ops())
    except Exception as exc:  # noqa: BLE001 - the evaluator's refusal (an operator it lacks)
        raise BackendInitializationError(f"{err}; ONNX's reference evaluator cannot run it either: {exc}",
                                         backend=backend) from exc


def _layer_scope(model: LoadedModel, proto: onnx.ModelProto, tensor: str, i: int) -> str:
    """Layer ``i``'s module path (``encoder.layer.1``) from the scope of the node making ``tensor``."""
    from ..modelio.onnx_file import node_scope

    producer = next((n for n in proto.graph.node if tensor in n.output), None)
    scope = node_scope(producer) if producer is not None else ""
    m = re.search(rf"^(.*?(?:layers?|h|blocks?)[._]{i})(?=[./_]|$)", scope.replace("/", "."))
    return m.group(1) if m else f"layer {i}"


def file_layer_export(backend: BaseBackend, model: LoadedModel, i: int, hidden_in: HiddenState, inputs: ModelInputs,
                      path: Path, layer_export: type[LayerExport]) -> LayerExport:
    """Layer ``i`` of an ONNX-file model cut out of the file the backend runs (from its input to
    its checkpoints, :func:`~._onnx_graph.cut_layer`), written to ``path``: the drill-down's layer graph,
    returned as a ``layer_export`` (the backend's ``LayerExport`` record).

    Raises:
        BackendInitializationError: the graph cannot be cut at the layer's boundaries.
    """
    import onnx

    from ._graph_feeds import graph_inputs
    from ._onnx_graph import LayerCutError, cut_layer

    names = backend._names
    start = layer_input_key(i)
    keys = [k for k in (CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)) if k in names]
    if start not in names or not keys:
        raise BackendInitializationError(f"layer {i}'s boundaries are not tensors of {backend.onnx_path.name}",
                                         backend=backend.name)
    proto = onnx.load_from_string(checkpoint_graph(backend.onnx_path, list(names.values())))
    try:
        cut = cut_layer(proto, names[start], [names[k] for k in keys], list(names.values()))
    except LayerCutError as exc:
        raise BackendInitializationError(f"layer {i} cannot be cut out of {backend.onnx_path.name}: {exc}",
                                         backend=backend.name) from exc
    onnx.save(cut, str(path))
    reference_path = None
    if getattr(backend, "model_file", None) is not None:  # the drill-down's trusted graph: the session's own file
        own = checkpoint_names(model)
        try:
            ref_cut = cut_layer(onnx.load_from_string(checkpoint_graph(model.path, list(own.values()))),
                                own[start], [own[k] for k in keys], list(own.values()))
        except LayerCutError as exc:
            raise BackendInitializationError(f"layer {i} cannot be cut out of {model.path.name}: {exc}",
                                             backend=backend.name) from exc
        reference_path = path.with_name(f"{path.stem}-reference.onnx")
        onnx.save(ref_cut, str(reference_path))
    hidden_input = cut.graph.input[0].name
    wanted = {x.name for x in cut.graph.input}
    feeds = {k: v for k, v in graph_inputs(model, inputs).items() if k in wanted}
    feeds[hidden_input] = np.asarray(hidden_in, dtype=np.float32)
    return layer_export(path=path, layer_name=_layer_scope(model, proto, names[keys[-1]], i), keys=keys,
                       hidden_input=hidden_input, feeds=feeds, reference_path=reference_path)
