"""The Model Explorer overlay: a session's error on the graph, in Google's Model Explorer.

Model Explorer (``pip install ai-edge-model-explorer``) shows a graph and colours its nodes from
*node data* files. This module writes both for a session:

* the **checkpoint graph** (``checkpoints.json``): one node per checkpoint in model order, grouped
  by layer, with per-checkpoint node data: the judged ``error``, its ``bound``, the ``margin``
  (error / bound; above 1 fails), and the layer's ``introduced`` and ``carried_in`` error;
* for each **drilled layer** (``ValidationResult.drilldown``), the layer's operator graph with
  per-operator ``introduced``, ``carried_in``, ``bound`` and ``margin``.

The node-data format is Model Explorer's (``model_explorer/node_data_builder.py`` and the UI's
``NodeDataProviderGraphData`` in google-ai-edge/model-explorer): a JSON object keyed by graph id,
each ``{"results": {node_id: {"value": number, "bgColor"?: css}}, "thresholds"?: [{"value",
"bgColor"}], "gradient"?: [{"stop", "bgColor"}]}``. ``thresholds`` colour a node whose value is
``<=`` an item's value; ``gradient`` (stops 0..1 over min..max) takes precedence; a result's own
``bgColor`` beats both. Node ids must be the ids Model Explorer gives the graph's nodes:

* its own JSON graph format (what this module writes): the ``id`` fields (a drill-down's own
  ``layer_graph.json`` node table is converted to it, ids kept);
* ONNX (the ``model-explorer-onnx`` adapter): the graph id is ``graph.name`` (``"<main>"`` when
  empty), node ids are node names (graph inputs, outputs and initializers are nodes ``"[value]
  <name>"``; unnamed nodes are named by the adapter's onnx_ir ``NameFixPass``, so a graph for the
  overlay names every node, as ``torch.onnx.export`` does);
* a ``torch.export`` ``.pt2`` (its built-in PyTorch adapter): one graph ``"graph"``, node ids are
  the FX node names of ``ep.graph_module.graph``.

Values that are unknown (NaN: a fused kernel) are left out of the node data (the node shows no
colour) and listed in ``manifest.json`` with any row whose node is not in the graph; nothing is
dropped silently. Open the result with::

    model-explorer DIR/checkpoints.json --node_data_paths=DIR/checkpoints.margin.json,...

(``manifest.json`` lists every graph with its node-data files and the exact command.)
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import sys
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigurationError, unwritable_output
from ..jsonio import JsonObject, JsonValue
from ..services.drilldown.types import LayerDrilldown
from ._common import as_float
from .documents import ReportSource, stored

if TYPE_CHECKING:
    import torch

    from ..services.validation.results import CheckpointResult, ValidationResult

__all__ = [
    "CHECKPOINT_GRAPH_ID",
    "PT2_GRAPH_ID",
    "OPERATOR_QUANTITIES",
    "CHECKPOINT_QUANTITIES",
    "node_data",
    "checkpoint_graph",
    "checkpoint_node_data",
    "fx_graph",
    "node_table_graph",
    "operator_table_graph",
    "operator_node_data",
    "graph_node_ids",
    "write_model_explorer",
    "write_session_model_explorer",
    "write_result_model_explorer",
    "OverlayGraph",
]

#: The graph id of the checkpoint graph this module writes.
CHECKPOINT_GRAPH_ID = "checkpoints"
#: The id Model Explorer's PyTorch ExportedProgram adapter gives its one graph.
PT2_GRAPH_ID = "graph"
OPERATOR_QUANTITIES = ("introduced", "carried_in", "margin", "bound")
CHECKPOINT_QUANTITIES = ("error", "bound", "margin", "introduced", "carried_in")

_PASS, _NEAR, _FAIL = "#a5d6a7", "#fff59d", "#ef9a9a"
_BIG = sys.float_info.max  # JSON has no Infinity: an infinite margin is shown as the largest float
#: margin <= 0.5: well within the bound; <= 1: passes, near it; above 1: beyond the bound.
_MARGIN_THRESHOLDS = [{"value": 0.5, "bgColor": _PASS}, {"value": 1.0, "bgColor": _NEAR},
                      {"value": _BIG, "bgColor": _FAIL}]
_ERROR_GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#ff9800"}]


def _finite(value: float | None) -> float | None:
    """A JSON-safe number: None for unknown/NaN, infinities clamped to the largest float."""
    if value is None or math.isnan(value):
        return None
    return max(-_BIG, min(_BIG, value))


def node_data(values: Mapping[str, float | None], graph_id: str, *, colors: Mapping[str, str] | None = None,
              thresholds: Sequence[Mapping[str, JsonValue]] | None = None,
              gradient: Sequence[Mapping[str, JsonValue]] | None = None, name: str | None = None) -> JsonObject:
    """One Model Explorer node-data document ``{graph_id: {"results": ..., ...}}``.

    ``values``: node id -> number (None/NaN left out); ``colors``: node id -> a CSS colour that
    overrides the thresholds/gradient for that node; ``name``: shown in Model Explorer's UI."""
    results: dict[str, JsonObject] = {}
    for node, value in values.items():
        v = _finite(value)
        if v is None:
            continue
        results[node] = {"value": v}
        if colors and node in colors:
            results[node]["bgColor"] = colors[node]
    graph: JsonObject = {"results": results}
    if name:
        graph["name"] = name
    if thresholds:
        graph["thresholds"] = [dict(t) for t in thresholds]
    if gradient:
        graph["gradient"] = [dict(g) for g in gradient]
    return {graph_id: graph}


# --- the checkpoint graph (the whole model) ------------------------------------------------------------


def _judged_error(row: CheckpointResult) -> tuple[float | None, str]:
    """The error the rule judged (its metric), else max |alt - ref|."""
    rule = row.judgement.rule
    if rule is not None and as_float(rule.alternative_error) is not None:
        return as_float(rule.alternative_error), rule.metric or "rmse"
    return as_float(row.comparison.max_abs_error), "max_abs_error"


def _introduced(row: CheckpointResult) -> float | None:
    """The error of the block ending here replayed on the reference's input (its rule's metric)."""
    rule = None if row.introduced is None else row.introduced.judgement.rule
    if rule is not None and as_float(rule.alternative_error) is not None:
        return as_float(rule.alternative_error)
    return as_float(row.introduced_error)


def _carried_in(row: CheckpointResult) -> float | None:
    """The error carried into the layer (RMSE where isolation measured it)."""
    rmse = None if row.accumulation is None else as_float(row.accumulation.get("carried_in_rmse"))
    return rmse if rmse is not None else as_float(row.propagated_error)


def _kv(key: str, value: object) -> dict[str, str]:
    return {"key": key, "value": "" if value is None else str(value)}


def checkpoint_graph(rows: Sequence[CheckpointResult], drilldowns: Iterable[LayerDrilldown] = (),
                     label: str = "checkpoints") -> JsonObject:
    """Model Explorer's JSON graph (a graph collection) of a session's checkpoints in model order:
    one node per checkpoint (id ``post_mlp:3``), namespaced by layer, each fed by the one before it."""
    culprits = {d.checkpoint: d.culprit for d in drilldowns if d.culprit is not None}
    nodes: list[JsonObject] = []
    previous: str | None = None
    for row in rows:
        cp, layer = row.key.name, row.key.layer
        error, metric = _judged_error(row)
        attrs = [_kv("passed", row.state), _kv(f"error ({metric})", error), _kv("bound", row.bound),
                 _kv("margin", row.margin), _kv("introduced", _introduced(row)),
                 _kv("carried_in", _carried_in(row)), _kv("reason", str(row.reason or "")[:300])]
        c = culprits.get(row.id)
        if c is not None:
            attrs.append(_kv("culprit", f"{c.op} ({c.module_path or c.node})"))
        node = {"id": row.id, "label": cp, "namespace": "" if layer is None else f"layer_{layer}",
                "attrs": attrs, "incomingEdges": [] if previous is None else [{"sourceNodeId": previous}]}
        nodes.append(node)
        previous = node["id"]
    return {"label": label, "graphs": [{"id": CHECKPOINT_GRAPH_ID, "nodes": nodes}]}


def checkpoint_node_data(rows: Sequence[CheckpointResult]) -> dict[str, JsonObject]:
    """Node data of the checkpoint graph, one document per quantity (:data:`CHECKPOINT_QUANTITIES`)."""
    ids = [r.id for r in rows]
    error = {i: _judged_error(r)[0] for i, r in zip(ids, rows)}
    verdict = {i: (_PASS if r.state else _FAIL) for i, r in zip(ids, rows) if r.state is not None}
    introduces = {i: (_FAIL if r.introduces_error else _PASS) for i, r in zip(ids, rows)
                  if r.introduces_error is not None}
    g = CHECKPOINT_GRAPH_ID
    return {
        "error": node_data(error, g, colors=verdict, gradient=_ERROR_GRADIENT, name="error (judged metric)"),
        "bound": node_data({i: r.bound for i, r in zip(ids, rows)}, g, gradient=_ERROR_GRADIENT, name="bound"),
        "margin": node_data({i: r.margin for i, r in zip(ids, rows)}, g,
                            thresholds=_MARGIN_THRESHOLDS, name="margin (error / bound)"),
        "introduced": node_data({i: _introduced(r) for i, r in zip(ids, rows)}, g, colors=introduces,
                                gradient=_ERROR_GRADIENT, name="introduced (layer replay)"),
        "carried_in": node_data({i: _carried_in(r) for i, r in zip(ids, rows)}, g, gradient=_ERROR_GRADIENT,
                                name="carried in"),
    }


# --- a drilled layer's operator graph ---------------------------------------------------------------


def operator_node_data(drill: LayerDrilldown, graph_id: str) -> dict[str, JsonObject]:
    """Node data of a drilled layer's operators, one document per quantity (:data:`OPERATOR_QUANTITIES`).

    ``introduced`` nodes are red when the operator exceeds its own bound, green within it."""
    rows = drill.operators
    verdict = {r.node: (_FAIL if r.introduces else _PASS) for r in rows if not math.isnan(r.margin)}
    return {
        "introduced": node_data({r.node: r.introduced for r in rows}, graph_id, colors=verdict,
                                gradient=_ERROR_GRADIENT, name=f"layer {drill.layer}: introduced"),
        "carried_in": node_data({r.node: r.carried_in for r in rows}, graph_id, gradient=_ERROR_GRADIENT,
                                name=f"layer {drill.layer}: carried in"),
        "margin": node_data({r.node: r.margin for r in rows}, graph_id, thresholds=_MARGIN_THRESHOLDS,
                            name=f"layer {drill.layer}: margin (introduced / bound)"),
        "bound": node_data({r.node: r.bound for r in rows}, graph_id, gradient=_ERROR_GRADIENT,
                           name=f"layer {drill.layer}: bound"),
    }


def _fx_label(node: torch.fx.Node) -> str:
    target = node.target
    if hasattr(target, "overloadpacket"):
        return str(target.overloadpacket)
    return node.op if node.op in ("placeholder", "output") else getattr(target, "__name__", str(target))


def _fx_namespace(node: torch.fx.Node) -> str:
    """``nn_module_stack`` as a Model Explorer namespace (``encoder/layer.2/intermediate``)."""
    if node.op == "placeholder":
        return "inputs"
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _cls in stack.values() if path]
    return paths[-1].replace(".", "/") if paths else ""


def fx_graph(graph_module: torch.fx.GraphModule, graph_id: str = PT2_GRAPH_ID, label: str = "layer") -> JsonObject:
    """Model Explorer's JSON graph of an FX ``GraphModule`` (what ``make_fx``/``torch.export``
    capture), node ids = FX node names, as Model Explorer's PyTorch adapter names them."""
    nodes = []
    for node in graph_module.graph.nodes:
        attrs = [_kv("target", node.target)]
        if node.meta.get("stack_trace"):
            attrs.append(_kv("stack_trace", str(node.meta["stack_trace"]).strip().splitlines()[-1][:300]))
        nodes.append({"id": node.name, "label": _fx_label(node), "namespace": _fx_namespace(node), "attrs": attrs,
                      "incomingEdges": [{"sourceNodeId": src.name, "targetNodeInputId": str(k)}
                                        for k, src in enumerate(node.all_input_nodes)]})
    return {"label": label, "graphs": [{"id": graph_id, "nodes": nodes}]}


def operator_table_graph(drill: LayerDrilldown, graph_id: str = PT2_GRAPH_ID) -> JsonObject:
    """A graph of the operator table alone, for a drill-down that wrote no graph file: nodes in
    graph order, each drawn after the one before (the table has no data-flow edges)."""
    nodes, previous = [], None
    for r in drill.operators:
        nodes.append({"id": r.node, "label": r.op, "namespace": r.module_path.replace(".", "/"),
                      "attrs": [_kv("source", r.source), _kv("note", "graph order, not data flow")],
                      "incomingEdges": [] if previous is None else [{"sourceNodeId": previous}]})
        previous = r.node
    return {"label": f"layer {drill.layer} (operator table)", "graphs": [{"id": graph_id, "nodes": nodes}]}


def _onnx_ids(path: Path) -> tuple[str, set[str]]:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise ValueError(f"not an ONNX model: {exc}") from exc
    # unnamed nodes get names from onnx_ir's NameFixPass, which depend on its version: not matched
    names = {node.name for node in model.graph.node if node.name}
    # graph inputs, outputs and initializers are drawn as nodes "[value] <name>" (get_value_node_name)
    names |= {f"[value] {v.name}" for v in (*model.graph.input, *model.graph.output, *model.graph.initializer)}
    return model.graph.name or "<main>", names


def node_table_graph(doc: Mapping[str, JsonValue], graph_id: str = PT2_GRAPH_ID) -> JsonObject:
    """Model Explorer's JSON graph of a drill-down's own graph file (the replay strategy's
    ``layer_graph.json``: ``{"layer", "nodes": [{"id", "op", "target", "inputs", "module_path",
    "source"}]}``), with data-flow edges from ``inputs``."""
    nodes = []
    for n in doc["nodes"]:
        target = str(n.get("target") or n.get("op") or n["id"])
        label = target.rsplit(".", 1)[0] if target.startswith("aten.") and target.count(".") >= 2 else target
        nodes.append({"id": str(n["id"]), "label": label if n.get("op") == "call_function" else str(n.get("op") or label),
                      "namespace": str(n.get("module_path") or "").replace(".", "/"),
                      "attrs": [_kv("target", target), _kv("source", n.get("source"))],
                      "incomingEdges": [{"sourceNodeId": str(src), "targetNodeInputId": str(k)}
                                        for k, src in enumerate(n.get("inputs") or [])]})
    return {"label": f"layer {doc.get('layer', '')}".strip(), "graphs": [{"id": graph_id, "nodes": nodes}]}


def _model_explorer_json(doc: JsonValue) -> JsonObject:
    """A JSON graph file as a Model Explorer graph collection: one already (a collection or a list
    of graphs), or a drill-down's node table converted (:func:`node_table_graph`)."""
    if isinstance(doc, list):
        return {"label": "graph", "graphs": doc}
    if isinstance(doc, Mapping) and "graphs" in doc:
        return dict(doc)
    return node_table_graph(doc)


def _json_ids(path: Path) -> tuple[str, set[str]]:
    graph = _model_explorer_json(json.loads(path.read_text()))["graphs"][0]
    return str(graph["id"]), {str(n["id"]) for n in graph["nodes"]}


def _pt2_ids(path: Path) -> tuple[str, set[str]]:
    """Node names of a ``.pt2`` read from its serialized graph JSON (no unpickling): inputs and the
    outputs of single-output nodes, whose FX node names are their output names."""
    names: set[str] = {"output"}  # FX's output node, which the adapter draws too
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if member.endswith("/models/model.json") or member == "models/model.json":
                graph = json.loads(archive.read(member))["graph_module"]["graph"]
                names |= {i["as_tensor"]["name"] for i in graph["inputs"] if "as_tensor" in i}
                for node in graph["nodes"]:
                    for out in node["outputs"]:
                        if "as_tensor" in out:
                            names.add(out["as_tensor"]["name"])
                        names |= {t["name"] for t in out.get("as_tensors", [])}
    return PT2_GRAPH_ID, names


def graph_node_ids(path: str | Path) -> tuple[str, set[str]]:
    """``(graph id, node ids)`` as Model Explorer names them, for an ``.onnx``, ``.pt2`` or
    Model Explorer ``.json`` graph. Raises ConfigurationError (DF005) for another kind of file."""
    p = Path(path)
    readers = {".onnx": _onnx_ids, ".json": _json_ids, ".pt2": _pt2_ids}
    reader = readers.get(p.suffix.lower())
    if reader is None:
        raise ConfigurationError(f"Model Explorer graphs are .onnx, .pt2 or .json, not {p.suffix!r}", file=str(p))
    try:
        return reader(p)
    except (OSError, ValueError, KeyError, IndexError, TypeError, zipfile.BadZipFile) as exc:
        raise ConfigurationError(f"cannot read the graph file: {exc}", file=str(p),
                                 hint="re-run the drill-down to write it again") from exc


# --- writing it all ---------------------------------------------------------------------------------


@dataclass
class OverlayGraph:
    """One graph written for Model Explorer with its node-data files and what was left out."""

    graph: str                     # file name in the output directory
    graph_id: str
    node_data: dict[str, str] = field(default_factory=dict)     # quantity -> file name
    unmatched: list[str] = field(default_factory=list)          # row node ids not in the graph
    unknown: list[str] = field(default_factory=list)            # node ids whose value is unknown (NaN)
    note: str = ""
    #: the quantity Model Explorer opens on: the checkpoints' margin, an operator graph's introduced error
    default: str | None = None

    def command(self, out_dir: Path) -> str:
        """The command that opens the graph with every node-data file, quoted for bash (a folder
        named ``$(rm -rf ~)`` or ``a b`` is one argument, never code); Model Explorer shows the last
        file loaded, so :attr:`default` goes last."""
        order = [q for q in self.node_data if q != self.default] + \
            ([self.default] if self.default in self.node_data else [])
        files = ",".join(str(out_dir / self.node_data[q]) for q in order)
        return shlex.join(["model-explorer", str(out_dir / self.graph), f"--node_data_paths={files}"])

    def to_dict(self, out_dir: Path) -> JsonObject:
        return {"graph": self.graph, "graph_id": self.graph_id, "node_data": dict(self.node_data),
                "default_overlay": self.default,
                "unmatched_nodes": self.unmatched, "unknown_values": self.unknown, "note": self.note,
                "command": self.command(out_dir)}


def _dump(path: Path, doc: JsonValue) -> None:
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")


def _write_node_data(out_dir: Path, stem: str, docs: Mapping[str, JsonObject], entry: OverlayGraph) -> None:
    for quantity, doc in docs.items():
        name = f"{stem}.{quantity}.json"
        _dump(out_dir / name, doc)
        entry.node_data[quantity] = name


def _copy_graph(source: Path, out_dir: Path, stem: str, drill: LayerDrilldown) -> OverlayGraph:
    """The drill-down's own graph file in ``out_dir`` (a JSON one in Model Explorer's format)."""
    graph_id, ids = graph_node_ids(source)
    name = f"{stem}{source.suffix.lower()}"
    if source.suffix.lower() == ".json":  # written in Model Explorer's format (converted if need be)
        _dump(out_dir / name, _model_explorer_json(json.loads(source.read_text())))
    else:
        shutil.copyfile(source, out_dir / name)
    return OverlayGraph(graph=name, graph_id=graph_id, unmatched=[r.node for r in drill.operators if r.node not in ids])


def _layer_graph(drill: LayerDrilldown, out_dir: Path, stem: str) -> OverlayGraph:
    """The drilled layer's graph in ``out_dir``: its own graph file, else (none written, missing,
    unreadable) a graph of its operator table, with a note saying why."""
    source = Path(drill.graph_file) if drill.graph_file else None
    why = "no graph file was written"
    if source is not None:
        why = f"graph file {source.name} is missing or not .onnx/.pt2/.json"
        if source.is_file() and source.suffix.lower() in (".onnx", ".pt2", ".json"):
            try:
                return _copy_graph(source, out_dir, stem, drill)
            except ConfigurationError as exc:
                why = f"graph file {source.name} could not be read ({exc.message})"
    doc = operator_table_graph(drill)
    _dump(out_dir / f"{stem}.json", doc)
    return OverlayGraph(graph=f"{stem}.json", graph_id=doc["graphs"][0]["id"],
                        note=f"{why}: the graph is the operator table in graph order")


def _layer_overlay(drill: LayerDrilldown, out_dir: Path) -> OverlayGraph:
    stem = f"layer_{drill.layer}" + (f"_step_{drill.step}" if drill.step else "")
    entry = _layer_graph(drill, out_dir, stem)
    matched = LayerDrilldown(layer=drill.layer, checkpoint=drill.checkpoint, backend=drill.backend,
                             method=drill.method, operators=[r for r in drill.operators if r.node not in entry.unmatched],
                             step=drill.step)
    entry.unknown = [r.node for r in matched.operators if math.isnan(r.introduced)]
    _write_node_data(out_dir, stem, operator_node_data(matched, entry.graph_id), entry)
    entry.default = "introduced"
    return entry


def write_model_explorer(rows: Sequence[CheckpointResult], out_dir: str | Path,
                         drilldowns: Iterable[LayerDrilldown] = (), *, label: str = "checkpoints") -> JsonObject:
    """Write the checkpoint graph of ``rows`` (a session's checkpoint results in model order), each
    drilled layer's graph, their node data and ``manifest.json`` into ``out_dir``; returns the manifest.

    Raises ConfigurationError (DF005) when ``out_dir`` cannot be written, ResourceExhaustedError
    (DF007) when there is no room to write there."""
    out = Path(out_dir).expanduser()
    drills = list(drilldowns)
    try:
        out.mkdir(parents=True, exist_ok=True)
        entry = OverlayGraph(graph="checkpoints.json", graph_id=CHECKPOINT_GRAPH_ID, default="margin")
        _dump(out / entry.graph, checkpoint_graph(rows, drills, label=label))
        _write_node_data(out, "checkpoints", checkpoint_node_data(rows), entry)
        graphs = [entry, *(_layer_overlay(d, out) for d in drills)]
        manifest = {"format": "model-explorer node data", "graphs": [g.to_dict(out) for g in graphs],
                    "checkpoints": [r.id for r in rows]}
        _dump(out / "manifest.json", manifest)
    except OSError as exc:
        raise unwritable_output(exc, "write the Model Explorer files", path=str(out),
                                hint="choose a writable directory") from exc
    return manifest


def write_session_model_explorer(report: ReportSource, out_dir: str | Path) -> JsonObject:
    """:func:`write_model_explorer` for a stored session (a ``ValidationReport``): its checkpoint
    results and the drill-downs it recorded, read back as the typed result."""
    return write_result_model_explorer(stored(report).result, out_dir)


def write_result_model_explorer(result: ValidationResult, out_dir: str | Path) -> JsonObject:
    """:func:`write_model_explorer` for a ``ValidationResult`` (its checkpoints and ``.drilldown``
    when a drill-down ran)."""
    return write_model_explorer(result.results, out_dir, result.drilldown or (), label=f"session {result.session_id}")
