"""Every node output of an ONNX-file model as a checkpoint (``mark_all``, the CLI's ``--mark-all``).

Each floating-point value a node of the graph makes (``Constant`` nodes aside: they compute
nothing) is compared, in the graph's topological order, between three runs of the same graph on
the session's inputs: the **reference** (the graph in float64, as the reference backend runs it),
the **alternative** (the file an engine that runs ONNX graphs runs, the session's
own or its ``model_file``, opened as that backend opens its graphs: providers, optimisation level or
precision hint, graph transform) and the **calibration** (the graph at the
alternative's precision, as the calibration's graph runner runs it; the reference's and the
calibration's runners mark their own sessions, :meth:`Float64GraphRunner.marked`). A value is judged by the calibrated rule of the checkpoints and layers
(:func:`.judge.node_output_verdict`, the judge's): its RMSE against the reference within
``noise_margin`` x the calibration's RMSE + ``floor_eps`` x eps(alternative dtype) x RMS(reference).
The first value over its bound, in topological order, is the node-level first divergence.

**Bounded memory.** The values are streamed: the names are taken in chunks of
:data:`CHUNK` in topological order, each run fetches one chunk's values (ONNX Runtime computes the
graph once per chunk, and holds every marked output of a run to its end: the runners' light
sessions mark one chunk at a time; ONNX's NumPy evaluator, where ONNX Runtime lacks a float64
kernel, makes one pass over the nodes and drops each value after its last reader), the three chunks
are compared and dropped before the next. What is kept is one row of scalars per value. The
alternative's own checkpoint session is released meanwhile (opened again on need), and the freed
heap is handed back after each chunk.

**What is not an error.** Only the valid (non-padded) positions count: on a value whose first axis
is the batch, every later axis as long as the sequence is restricted to the attention mask's
positions. A value saturated in the alternative's type where the reference lies beyond that type's
range (the attention mask's ``finfo.min`` constant in a float16 file: -65504 against -3.4e38), of the
same sign, is that type's rounding and matches; NaN matches NaN. Values near zero are judged by
RMSE against the calibrated bound, never relative to themselves.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...backends._onnx_file import saturating_rmse
from ...backends._onnx_weights import numpy_stream
from ...backends.capabilities import GraphSessionBackend, capabilities, graph_runner, release
from ...errors import ConfigurationError
from .context import RunContext, Stage, call_backend
from .judge import node_output_verdict
from .memory import give_back_freed

if TYPE_CHECKING:
    import onnx

    from ...backends._graph_session import GraphSession
    from ...backends._onnx_weights import FedSession
    from ...backends.base import Backend
    from ...jsonio import JsonObject

__all__ = ["CHUNK", "MarkAllStage", "NodeOutput", "MarkAllReport", "node_outputs", "compare_value", "valid_mask",
           "numpy_stream"]

#: How many node outputs one run fetches (the bound on the values held at once, per run).
CHUNK = 64
_FLOAT_ELEMS = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_FLOAT = 1
_NOT_JUDGED = frozenset({"Constant"})
#: Largest finite value per dtype of the alternative (saturation), bfloat16 as float32's range.
_BIG = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}


@dataclass(frozen=True)
class NodeOutput:
    """One node output's comparison: where it is and how it was judged."""

    index: int  #: its position among the compared values (topological order)
    tensor: str
    node: str
    op: str
    layer: int | None
    error: float  #: RMSE of the alternative against the reference (inf: shape or non-finite mismatch)
    noise: float  #: RMSE of the calibration against the reference
    bound: float
    passed: bool


@dataclass
class MarkAllReport:
    """What the mark-all comparison found: the JSON's ``mark_all``."""

    compared: int = 0
    failed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  #: why -> how many values were not compared
    first_divergence: NodeOutput | None = None
    failures: list[NodeOutput] = field(default_factory=list)
    chunks: int = 0
    chunk_size: int = CHUNK
    reference_runtime: str = ""  #: what ran the reference's graph (the engine's name, or ``onnx.reference``)
    elapsed_s: float = 0.0

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d["first_divergence"] = None if self.first_divergence is None else asdict(self.first_divergence)
        return d


def node_outputs(path: Path) -> list[tuple[str, onnx.NodeProto]]:
    """The floating-point values the nodes of the ONNX file ``path`` make, in topological (graph)
    order, each with its node; ``Constant`` nodes and values of unknown type left out."""
    from ...backends._onnx_weights import light_graph

    return _node_outputs_of(light_graph(path))


def _node_outputs_of(model: onnx.ModelProto) -> list[tuple[str, onnx.NodeProto]]:
    """:func:`node_outputs` of an ``onnx.ModelProto`` (each node a copy: a node of the model would
    keep the whole model, its weights, alive)."""
    import onnx

    from ...backends._onnx_file import value_types

    types = value_types(model) or {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    found = []
    for node in model.graph.node:
        outs = [out for out in node.output if out and types.get(out) in _FLOAT_ELEMS]
        if outs and node.op_type not in _NOT_JUDGED:
            own = onnx.NodeProto()
            own.CopyFrom(node)
            found.extend((out, own) for out in outs)
    return found


def valid_mask(shape: tuple[int, ...], attention_mask: np.ndarray) -> np.ndarray | None:
    """The valid positions of a value of ``shape``: where its first axis is the batch, every later
    axis as long as the sequence restricted to ``attention_mask``'s ones; None when nothing is padded
    or the value is not laid out so."""
    mask = np.asarray(attention_mask).astype(bool)
    if mask.all() or len(shape) < 2 or shape[0] != mask.shape[0]:
        return None
    valid = np.ones(shape, dtype=bool)
    for axis in range(1, len(shape)):
        if shape[axis] == mask.shape[1]:
            view = [1] * len(shape)
            view[0], view[axis] = mask.shape[0], mask.shape[1]
            valid &= mask.reshape(view)
    return valid


def compare_value(reference: np.ndarray, alternative: np.ndarray, calibration: np.ndarray, valid: np.ndarray | None, dtype: str,
                  margin: float, floor_eps: float) -> tuple[float, float, float, bool]:
    """``(error, noise, bound, passed)`` of one value by the calibrated rule at ``dtype`` (the
    alternative's precision), on the positions ``valid`` (None: all)."""
    ref = np.asarray(reference, dtype=np.float64)
    alt, cal = np.asarray(alternative), np.asarray(calibration)
    if alt.shape != ref.shape or cal.shape != ref.shape:
        return math.inf, (math.inf if cal.shape != ref.shape else 0.0), 0.0, False
    alt, cal = alt.astype(np.float64), cal.astype(np.float64)
    if valid is not None:
        ref, alt, cal = ref[valid], alt[valid], cal[valid]
    big = _BIG.get(dtype, _BIG["float32"])
    error, noise = saturating_rmse(ref, alt, big), saturating_rmse(ref, cal, big)
    sane = ref[np.isfinite(ref) & (np.abs(ref) < big)]
    bound, passed = node_output_verdict(error, noise, sane if sane.size else np.zeros(1), dtype, margin, floor_eps)
    return error, noise, bound, passed


def _stream(first: GraphSession | FedSession, reopen: Callable[[list[str]], GraphSession | FedSession] | None,
            feeds: Mapping[str, np.ndarray], chunks: list[list[str]]) -> Iterator[dict[str, np.ndarray]]:
    """The values of ``chunks``, one chunk at a time. ONNX's NumPy evaluator (``first``, a runner's
    :class:`~debug_framework.backends._onnx_weights.FedSession`: its weights fed as well): one
    streamed pass. ONNX Runtime computes every output of its graph on each run, fetched or not, and
    holds them all to the run's end: with ``reopen`` each chunk is run by a session of its own that
    marks that chunk alone (``first`` the first chunk's), dropped before the next is opened; without,
    ``first`` marks every value and runs once per chunk."""
    session, first = first, None
    inner = getattr(session, "inner", session)
    if hasattr(inner, "rt_nodes_"):
        yield from numpy_stream(inner, {**feeds, **getattr(session, "weights", {})}, chunks)
        return
    for i, chunk in enumerate(chunks):
        if i and reopen is not None:
            session = None  # dropped before the next chunk's is built
            session = reopen(chunk)
        yield dict(zip(chunk, session.run(chunk, dict(feeds))))


def _graph_session(path: Path, names: list[str], dtype: str, runner: Backend | None
                   ) -> tuple[GraphSession | FedSession, str]:
    """The graph of ``path`` at ``dtype`` with ``names`` as outputs, as the graph runner of the
    backend ``runner`` opens it (in the runtime it found, when it has one): ``(session, runtime)``.
    A runner of that graph at that dtype marks its own session (:meth:`Float64GraphRunner.marked`):
    no second copy of the weights, no second retyping of the file."""
    from ...backends._onnx_file import Float64GraphRunner

    own = graph_runner(runner)
    found = own.runtime if isinstance(own, Float64GraphRunner) else None
    if isinstance(own, Float64GraphRunner) and own.dtype == dtype and Path(own.model.path) == Path(path):
        return own.marked(names), own.runtime
    return Float64GraphRunner.open_marked(path, names, dtype, "calibration" if runner is None else runner.name, found)


class MarkAllStage(Stage):
    """Every node output of an ONNX-file model compared in topological order (see the module)."""

    name = "mark-all"
    timing_key = "mark_all_s"

    def applies(self, config: Mapping[str, Any]) -> bool:
        return bool(config.get("mark_all"))

    def run(self, ctx: RunContext) -> None:
        from ...modelio.onnx_file import onnx_feeds

        model, alternative = ctx.model, ctx.alternative
        if getattr(model, "format", None) != "onnx" or not capabilities(alternative).graph_sessions.ok:
            raise ConfigurationError(
                "mark_all compares every node output of an ONNX file: it needs an ONNX-file model "
                f"(--model-path FILE.onnx) and an alternative that runs ONNX graphs, {_onnx_engines()} "
                f"(not {alternative.name!r})",
                hint=f"drop --mark-all, or validate the ONNX file against {_onnx_engines()}")
        ctx.evidence.mark_all = mark_all(ctx, onnx_feeds(model.config, ctx.inputs)).to_dict()


def _onnx_engines() -> str:
    """The registered engines that run ONNX files (their registry records say so), for messages."""
    from ...backends.registry import engines

    return " or ".join(e.name for e in engines() if "onnx" in e.file_formats) or "an engine that runs them"


def mark_all(ctx: RunContext, feeds: dict[str, np.ndarray], chunk: int = CHUNK) -> MarkAllReport:
    """The comparison of every node output (see the module), streamed chunk by chunk."""
    import onnx

    from ...backends._onnx_file import add_outputs, checkpoint_proto, value_types
    from ...modelio.onnx_file import layer_of_scope, node_scope

    start = time.perf_counter()
    plan, model, alternative = ctx.plan, ctx.model, ctx.alternative
    graph = cast(GraphSessionBackend, alternative)  # MarkAllStage checked its graph_sessions
    alt_path: Path = Path(graph.onnx_path) if graph.model_file else Path(model.path)
    report = MarkAllReport(chunk_size=chunk)
    release(alternative, "session")  # its checkpoint session (opened again on need): the file's weights held once
    own = node_outputs(Path(model.path))
    alt_model = checkpoint_proto(alt_path, [])  # read once: its values, then its graph with them marked
    present = set(dict(_node_outputs_of(alt_model))) if alt_path != Path(model.path) else None
    values = [(n, node) for n, node in own if present is None or n in present]
    if present is not None and len(values) < len(own):
        report.skipped["not in the alternative's file"] = len(own) - len(values)
    names = [n for n, _ in values]
    chunks = [names[i:i + chunk] for i in range(0, len(names), chunk)]
    first = chunks[0] if chunks else []

    def ref_open(tensors: list[str]) -> GraphSession | FedSession:
        return _graph_session(Path(model.path), tensors, plan.reference_dtype, ctx.reference)[0]

    def cal_open(tensors: list[str]) -> GraphSession | FedSession:
        return _graph_session(Path(model.path), tensors, plan.alternative_dtype, ctx.calibrator)[0]

    add_outputs(alt_model, names, value_types(alt_model), _FLOAT)
    # written to a file the runtime reads itself (no serialized copy held)
    with tempfile.TemporaryDirectory(prefix="df-mark-all-") as tmp:
        marked = Path(tmp) / alt_path.name
        # its weights written out one by one beside it (external data): no serialized copy of
        # the whole model is made on the way
        onnx.save(alt_model, str(marked), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{marked.name}.data", size_threshold=4096)
        del alt_model
        give_back_freed()  # the parsed file
        alt_session = call_backend(alternative, "open_session(mark-all)", lambda: graph.open_session_file(marked))
    give_back_freed()  # the serialized graph
    ref_first, report.reference_runtime = call_backend(
        ctx.reference, "mark-all graph", lambda: _graph_session(Path(model.path), first, plan.reference_dtype,
                                                                ctx.reference))
    cal_first = call_backend(ctx.reference, "mark-all calibration graph", lambda: cal_open(first))
    # the runners' sessions (light: their weights are fed) mark one chunk at a time, the alternative's every value
    streams: list[Iterator[dict[str, np.ndarray]]] = [
        _stream(ref_first, ref_open, feeds, chunks), _stream(alt_session, None, feeds, chunks),
        _stream(cal_first, cal_open, feeds, chunks)]
    del ref_first, alt_session, cal_first
    margin, floor_eps = float(plan.config["noise_margin"]), float(plan.config["floor_eps"])
    mask = np.asarray(ctx.inputs.attention_mask)
    by_name: dict[str, onnx.NodeProto] = dict(values)
    index = 0
    run: Callable[[], tuple[dict[str, np.ndarray], ...]] = lambda: tuple(next(s) for s in streams)  # noqa: E731
    for _ in chunks:
        ref_c, alt_c, cal_c = call_backend(alternative, "run(mark-all chunk)", run)
        report.chunks += 1
        for name in ref_c:
            ref = ref_c[name]
            err, noise, bound, passed = compare_value(ref, alt_c[name], cal_c[name], valid_mask(np.shape(ref), mask),
                                                      plan.alternative_dtype, margin, floor_eps)
            node = by_name[name]
            row = NodeOutput(index, name, node.name, node.op_type, layer_of_scope(node_scope(node)), err, noise,
                             bound, passed)
            index += 1
            report.compared += 1
            if not passed:
                report.failed += 1
                report.failures.append(row)
                if report.first_divergence is None:
                    report.first_divergence = row
        del ref_c, alt_c, cal_c
        give_back_freed()  # the chunk's values and the runs' buffers
    report.elapsed_s = time.perf_counter() - start
    return report
