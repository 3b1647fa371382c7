"""ONNX helpers of the ONNX-graph engines (:mod:`._onnx_export`): one layer, or one layer's MLP block, cut out of the
model's exported graph (what isolation replays, so no layer is exported a second time), and the
exporter's chatter kept in the artifact directory's log instead of the terminal.

The model's export has every checkpoint as a graph output, so each layer's boundaries are named
values: layer ``i`` reads ``post_embedding`` (i = 0) or ``post_mlp_<i-1>`` and writes
``post_attention_<i>`` (what its MLP block reads) and ``post_mlp_<i>``. :func:`cut_layer` keeps the
nodes those outputs need, with the layer's (or the block's) input value made a graph input; the
mask and position computations the layer also reads stay in the cut, fed by the model's own
``input_ids`` / ``attention_mask``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["EXPORT_LOG", "LayerCutError", "captured_output", "cut_layer"]

#: The log file, in the artifact directory, that receives what the exporter logs and warns.
EXPORT_LOG = "export.log"

#: Loggers the exporter writes through (torch's own handler prints them to stderr).
_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnx")

#: One capture at a time in a process: loggers and warning filters are process-wide,
#: and two overlapping captures would restore each other's state.
_CAPTURE_LOCK = threading.RLock()


class LayerCutError(Exception):
    """The graph cannot be cut at a layer's boundaries so that the cut replays the layer on its input."""


def _reads(node: onnx.NodeProto) -> list[str]:
    """The value names ``node`` reads: its inputs and, for control flow, what its subgraphs read."""
    names = [x for x in node.input if x]
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.extend(_reads(inner))
    return names


def _copied(graph: onnx.GraphProto, name: str) -> str | None:
    """The value the Identity node making ``name`` copies (through a chain of Identity nodes), or
    None where ``name`` is not made by an Identity node."""
    producer = {out: node for node in graph.node for out in node.output if out}
    source = None
    while (node := producer.get(source or name)) is not None and node.op_type == "Identity" and node.input[0]:
        source = node.input[0]
    return source


def cut_layer(model: onnx.ModelProto, hidden: str, outputs: Sequence[str], checkpoints: Sequence[str]) -> onnx.ModelProto:
    """The part of ``model`` (an ``onnx.ModelProto``) that computes ``outputs`` from the value named
    ``hidden``, that value made a graph input; other graph inputs are kept where the cut reads them.
    A layer is cut from its input to its checkpoints, a layer's MLP block from ``post_attention_<i>``
    to ``post_mlp_<i>``.

    Where ``hidden`` is an Identity copy of another value that the nodes read instead (an exporter
    may name a copy for the graph output), the cut starts at that value: the cut's first graph input
    is the value it starts at (``hidden`` or that one), typed as ``hidden``; feed it by that name.

    Initializers are copied as they are (references into the model's external data file when it
    was loaded with ``load_external_data=False``: the caller points ONNX Runtime at that folder).

    Raises:
        LayerCutError: ``hidden`` or an output is not a graph output, no node of the cut reads
            ``hidden`` (nor the value it copies), or another of ``checkpoints`` lies inside the cut (it
            would recompute earlier layers instead of starting at ``hidden``).
    """
    declared = {o.name: o for o in model.graph.output}
    missing = [n for n in (hidden, *outputs) if n not in declared]
    if missing:
        raise LayerCutError(f"{', '.join(missing)} not among the graph's outputs")
    try:
        return _cut(model, hidden, declared[hidden], outputs, checkpoints)
    except LayerCutError as exc:
        source = _copied(model.graph, hidden)
        if source is None:
            raise
        info = type(declared[hidden])()
        info.CopyFrom(declared[hidden])
        info.name = source
        try:
            return _cut(model, source, info, outputs, checkpoints)
        except LayerCutError:
            raise exc from None


def _cut(model: onnx.ModelProto, start: str, start_info: onnx.ValueInfoProto, outputs: Sequence[str], checkpoints: Sequence[str]) -> onnx.ModelProto:
    """:func:`cut_layer` at the value ``start`` (its graph input declared by ``start_info``)."""
    import onnx

    graph = model.graph
    declared = {o.name: o for o in graph.output}
    all_nodes = list(graph.node)
    producer = {name: index for index, node in enumerate(all_nodes) for name in node.output if name}
    kept: set[int] = set()
    stack = list(outputs)
    while stack:
        index = producer.get(name := stack.pop())
        if name == start or index is None or index in kept:
            continue
        kept.add(index)
        stack.extend(_reads(all_nodes[index]))
    nodes = [all_nodes[index] for index in sorted(kept)]  # graph order: topological
    read = {x for n in nodes for x in _reads(n)}
    made = {x for n in nodes for x in n.output}
    if start not in read:
        raise LayerCutError(f"no node computing {', '.join(outputs)} reads {start!r}")
    inside = sorted(made & (set(checkpoints) - set(outputs)))
    if inside:
        raise LayerCutError(f"the cut at {start!r} still computes {', '.join(inside)}")
    sub = onnx.helper.make_graph(
        nodes, f"{graph.name or 'model'}:{start}->{outputs[-1]}",
        [start_info, *(i for i in graph.input if i.name in read and i.name != start)],
        [declared[o] for o in outputs],
        initializer=[t for t in graph.initializer if t.name in read],
        value_info=[v for v in graph.value_info if v.name in made],
    )
    cut = onnx.helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    cut.functions.extend(model.functions)
    return cut


def _prints(handler: logging.Handler) -> bool:
    """Whether ``handler`` writes to the terminal (stderr / stdout)."""
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and handler.stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__))


def _exporter_loggers() -> list[logging.Logger]:
    """The top loggers of :data:`_LOGGERS` and every existing logger below them with handlers of
    its own (torch gives ``torch.onnx`` its own stderr handler)."""
    below = tuple(f"{name}." for name in _LOGGERS)
    found = [logging.getLogger(name) for name in _LOGGERS]
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.startswith(below) and logger.handlers:
            found.append(logger)
    return found


@contextlib.contextmanager
def captured_output(log: Path, title: str) -> Iterator[None]:
    """Run the block with what it logs (the ``torch``, ``onnxscript``, ``onnx_ir`` and ``onnx``
    loggers as they exist when it starts) and warns kept out of the terminal and appended to
    ``log`` under ``title``.

    The exporter's ~30 lines of warnings (log records and Python warnings; it prints nothing
    itself) would otherwise break a progress bar. ``sys.stdout`` / ``sys.stderr`` are left alone:
    a progress bar drawn on them keeps running during the export and stays out of the log. Writing
    the log is best effort: a log that cannot be written never fails the export it describes.
    Captures in several threads run one at a time.
    """
    with _CAPTURE_LOCK:
        with _captured(log, title):
            yield


@contextlib.contextmanager
def _captured(log: Path, title: str) -> Iterator[None]:
    """:func:`captured_output` itself, under the caller's lock."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = []
    for logger in _exporter_loggers():
        printing = [h for h in logger.handlers if _prints(h)]
        top = logger.name in _LOGGERS and logger.propagate  # would reach the root logger's handlers
        if printing or top:
            saved.append((logger, logger.handlers[:], logger.propagate))
            logger.handlers = [h for h in logger.handlers if h not in printing] + [handler]
            logger.propagate = logger.propagate and not top
    caught: list[warnings.WarningMessage] = []
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        lines = [f"== {title} ({time.perf_counter() - start:.2f} s)", buf.getvalue().rstrip("\n")]
        lines += [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
        with contextlib.suppress(OSError):
            with log.open("a", encoding="utf-8") as fh:
                fh.write("\n".join(line for line in lines if line) + "\n")
