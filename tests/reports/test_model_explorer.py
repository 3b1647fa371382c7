"""The Model Explorer overlay: node-data files valid against Model Explorer's node-data schema
(fixtures/model_explorer_node_data.schema.json, written from its source), every node id in them a
node of the graph they go with (parsed here independently: ME JSON directly, ONNX with ``onnx``,
``.pt2`` with ``torch.export.load``), and the error on the right nodes.

The drilled layers are real: a tiny transformer MLP block captured with ``make_fx`` (and exported
with ``torch.export``), every operator replayed in float32 on the float64 run's inputs to it, one
operator (GELU) computed with the tanh approximation, as a module backend's bug would have it.
"""

from __future__ import annotations

import json
import math
import operator
from pathlib import Path

import jsonschema
import pytest

from debug_framework.cli.session_report import main
from debug_framework.reports.model_explorer import (CHECKPOINT_GRAPH_ID, PT2_GRAPH_ID, fx_graph, graph_node_ids,
                                                    write_model_explorer)
from debug_framework.services.drilldown.types import Culprit, LayerDrilldown, OperatorRow

FIXTURES = Path(__file__).parent / "fixtures"
NODE_DATA_SCHEMA = json.loads((FIXTURES / "model_explorer_node_data.schema.json").read_text())
GRAPH_SCHEMA = json.loads((FIXTURES / "model_explorer_graph.schema.json").read_text())
RED = "#ef9a9a"


# --- a real drilled layer -------------------------------------------------------------------------


def _block():
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.norm = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))

    torch.manual_seed(0)
    return Block().double()


def _rms(a, b) -> float:
    return float(((a.double() - b.double()) ** 2).mean().sqrt())


def _drill(graph_module, placeholders: list, layer: int = 1) -> LayerDrilldown:
    """Replay each ATen operator of ``graph_module`` in float32 on the float64 run's inputs to it
    (GELU with the tanh approximation: the bug) and in a whole float32 run: introduced, carried-in
    and a bound of 8 float32 ulps of the output's RMS."""
    import torch

    def alt(node, args):
        cast = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        if node.target == torch.ops.aten.gelu.default:
            return torch.ops.aten.gelu.default(cast[0], approximate="tanh")
        return node.target(*cast, **node.kwargs)

    ref: dict = {}
    run: dict = {}
    rows = []
    inputs = iter(placeholders)
    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            ref[node.name] = run[node.name] = next(inputs)
            continue
        if node.op == "get_attr":
            ref[node.name] = run[node.name] = getattr(graph_module, node.target)
            continue
        if node.op != "call_function":
            continue
        r_args = [ref[a.name] if isinstance(a, torch.fx.Node) else a for a in node.args]
        a_args = [run[a.name] if isinstance(a, torch.fx.Node) else a for a in node.args]
        if node.target is operator.getitem:
            ref[node.name], run[node.name] = r_args[0][node.args[1]], a_args[0][node.args[1]]
            continue
        ref[node.name], run[node.name] = node.target(*r_args, **node.kwargs), alt(node, a_args)
        if not isinstance(ref[node.name], torch.Tensor):
            continue
        carried = [_rms(run[a.name], ref[a.name]) for a in node.all_input_nodes
                   if isinstance(ref[a.name], torch.Tensor) and ref[a.name].is_floating_point()]
        out = ref[node.name]
        rows.append(OperatorRow(index=len(rows), node=node.name, op=str(node.target), module_path="",
                                introduced=_rms(alt(node, r_args), out), carried_in=max(carried, default=0.0),
                                bound=8 * float(torch.finfo(torch.float32).eps) * float(out.pow(2).mean().sqrt()) + 1e-12))
    first = next(r for r in rows if r.introduces)
    return LayerDrilldown(layer=layer, checkpoint=f"post_mlp:{layer}", backend="hf_bug_gelu_variant", method="replay",
                          operators=rows, culprit=Culprit(op=first.op, node=first.node))


@pytest.fixture(scope="module")
def fx_layer():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    block, x = _block(), torch.randn(2, 4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gm = make_fx(block)(x)
        return gm, _drill(gm, [x])


# --- checks ---------------------------------------------------------------------------------------


def _node_data_files(out: Path, manifest: dict, graph: str) -> dict[str, dict]:
    entry = next(g for g in manifest["graphs"] if g["graph"] == graph)
    docs = {q: json.loads((out / name).read_text()) for q, name in entry["node_data"].items()}
    for doc in docs.values():
        jsonschema.validate(doc, NODE_DATA_SCHEMA)
        for graph_data in doc.values():
            assert all(g["stop"] in (0, 1) for g in graph_data.get("gradient", [])) or not graph_data.get("gradient")
    return docs


def _ids_used(docs: dict[str, dict]) -> tuple[set[str], set[str]]:
    """(graph ids, node ids) the node data refers to."""
    return ({g for d in docs.values() for g in d}, {n for d in docs.values() for g in d.values() for n in g["results"]})


def test_the_schema_fixture_rejects_what_model_explorer_would_not_read():
    jsonschema.validate({"g": {"results": {"a": {"value": 1.5, "bgColor": RED}}}}, NODE_DATA_SCHEMA)
    for bad in ({"g": {"results": {"a": {"value": "NaN"}}}}, {"g": {"results": {"a": 1.0}}},
                {"g": {"nodes": {}}}, {"g": {"results": {}, "gradient": [{"stop": 2}]}},
                {"g": {"results": {}, "thresholds": [{"value": 1}]}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, NODE_DATA_SCHEMA)


def test_fx_layer_graph_and_node_data_match(fx_layer, tmp_path):
    gm, drill = fx_layer
    assert drill.culprit.op == "aten.gelu.default" and [r.op for r in drill.introducing] == ["aten.gelu.default"]
    graph_file = tmp_path / "captured.json"
    graph_file.write_text(json.dumps(fx_graph(gm)))  # what a replay strategy writes beside its table
    drill.graph_file = str(graph_file)
    out = tmp_path / "me"
    manifest = write_model_explorer([], out, [drill])
    entry = manifest["graphs"][1]
    graph = json.loads((out / entry["graph"]).read_text())
    jsonschema.validate(graph, GRAPH_SCHEMA)
    ids = {n["id"] for n in graph["graphs"][0]["nodes"]}
    assert ids == {n.name for n in gm.graph.nodes}
    docs = _node_data_files(out, manifest, entry["graph"])
    assert set(docs) == {"introduced", "carried_in", "margin", "bound"}
    graph_ids, used = _ids_used(docs)
    assert graph_ids == {graph["graphs"][0]["id"]} and used and used <= ids
    introduced = docs["introduced"][PT2_GRAPH_ID]["results"]
    culprit = drill.culprit.node
    assert introduced[culprit]["bgColor"] == RED
    assert [n for n, r in introduced.items() if r.get("bgColor") == RED] == [culprit]
    assert docs["margin"][PT2_GRAPH_ID]["results"][culprit]["value"] > 1
    later = [r for r in drill.operators if r.index > next(x.index for x in drill.operators if x.node == culprit)]
    assert any(docs["carried_in"][PT2_GRAPH_ID]["results"][r.node]["value"] > 0 for r in later)
    assert entry["unmatched_nodes"] == [] and "--node_data_paths=" in entry["command"]


def test_a_drill_downs_node_table_json_is_converted_with_its_data_flow(fx_layer, tmp_path):
    gm, drill = fx_layer
    table = {"layer": "encoder.layer.1", "nodes": [  # the replay strategy's layer_graph.json
        {"id": n.name, "op": n.op, "target": str(n.target), "inputs": [a.name for a in n.all_input_nodes],
         "module_path": "encoder.layer.1.intermediate", "source": ""} for n in gm.graph.nodes]}
    (tmp_path / "layer_graph.json").write_text(json.dumps(table))
    manifest = write_model_explorer([], tmp_path / "me", [LayerDrilldown(**{**drill.__dict__,
                                                                            "graph_file": str(tmp_path / "layer_graph.json")})])
    entry = manifest["graphs"][1]
    graph = json.loads((tmp_path / "me" / entry["graph"]).read_text())
    jsonschema.validate(graph, GRAPH_SCHEMA)
    nodes = {n["id"]: n for n in graph["graphs"][0]["nodes"]}
    assert set(nodes) == {n.name for n in gm.graph.nodes} and entry["unmatched_nodes"] == [] and not entry["note"]
    gelu = next(n for n in gm.graph.nodes if n.name == drill.culprit.node)
    assert [e["sourceNodeId"] for e in nodes[gelu.name]["incomingEdges"]] == [a.name for a in gelu.all_input_nodes]
    assert nodes[gelu.name]["label"] == "aten.gelu" and nodes[gelu.name]["namespace"] == "encoder/layer/1/intermediate"
    _ids, used = _ids_used(_node_data_files(tmp_path / "me", manifest, entry["graph"]))
    assert used <= set(nodes)


def test_an_unreadable_graph_file_falls_back_to_the_operator_table(fx_layer, tmp_path):
    _gm, drill = fx_layer
    (tmp_path / "broken.onnx").write_bytes(b"not a protobuf \xff\xfe")
    manifest = write_model_explorer([], tmp_path / "me", [LayerDrilldown(**{**drill.__dict__,
                                                                            "graph_file": str(tmp_path / "broken.onnx")})])
    entry = manifest["graphs"][1]
    assert entry["graph"] == "layer_1.json" and "broken.onnx could not be read" in entry["note"]
    assert len(entry["node_data"]) == 4


def test_pt2_graph_node_ids_are_export_node_names(tmp_path):
    import torch

    block, x = _block(), torch.randn(2, 4, 16, dtype=torch.float64)
    ep = torch.export.export(block, (x,))
    state = {**ep.state_dict, **ep.constants}
    with torch.no_grad():
        drill = _drill(ep.graph_module, [state[s.target] if s.target in state else x for s in ep.graph_signature.input_specs])
    path = tmp_path / "layer.pt2"
    torch.export.save(ep, str(path))
    drill.graph_file = str(path)
    out = tmp_path / "me"
    manifest = write_model_explorer([], out, [drill])
    entry = manifest["graphs"][1]
    names = {n.name for n in torch.export.load(str(out / entry["graph"])).graph_module.graph.nodes}  # our own file
    docs = _node_data_files(out, manifest, entry["graph"])
    graph_ids, used = _ids_used(docs)
    assert graph_ids == {PT2_GRAPH_ID} and used and used <= names
    assert graph_node_ids(out / entry["graph"])[1] == names and entry["unmatched_nodes"] == []
    assert docs["introduced"][PT2_GRAPH_ID]["results"]["gelu"]["bgColor"] == RED


def _onnx_layer(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc1/MatMul"),
             helper.make_node("Gelu", ["h"], ["g"], name="/act/Gelu", domain="com.microsoft"),
             helper.make_node("Add", ["x", "g"], ["y"], name="/Add")]
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.1] * 16)
    graph = helper.make_graph(nodes, "layer_2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(graph), str(path))


def test_onnx_layer_uses_node_names_and_lists_unmatched_rows(tmp_path):
    import onnx

    _onnx_layer(tmp_path / "layer_2.onnx")
    rows = [OperatorRow(0, "/fc1/MatMul", "MatMul", introduced=1e-7, carried_in=0.0, bound=1e-6),
            OperatorRow(1, "/act/Gelu", "Gelu", introduced=3e-4, carried_in=1e-7, bound=1e-6),
            OperatorRow(2, "/Add", "Add", introduced=math.nan, carried_in=3e-4, bound=1e-6),
            OperatorRow(3, "/gone/Mul", "Mul", introduced=1e-3, carried_in=0.0, bound=1e-6)]
    drill = LayerDrilldown(layer=2, checkpoint="post_mlp:2", backend="onnx_runtime", method="onnx", operators=rows,
                           culprit=Culprit(op="Gelu", node="/act/Gelu"), graph_file=str(tmp_path / "layer_2.onnx"))
    out = tmp_path / "me"
    manifest = write_model_explorer([], out, [drill])
    entry = manifest["graphs"][1]
    model = onnx.load(str(out / entry["graph"]))
    docs = _node_data_files(out, manifest, entry["graph"])
    graph_ids, used = _ids_used(docs)
    assert graph_ids == {model.graph.name} == {"layer_2"}
    assert used <= {n.name for n in model.graph.node}
    assert entry["unmatched_nodes"] == ["/gone/Mul"] and entry["unknown_values"] == ["/Add"]
    assert "/Add" not in docs["introduced"]["layer_2"]["results"]  # unknown: no colour, never a made-up 0
    assert docs["introduced"]["layer_2"]["results"]["/act/Gelu"]["bgColor"] == RED


def test_a_layer_without_a_graph_file_gets_the_operator_table_graph(fx_layer, tmp_path):
    _gm, drill = fx_layer
    bare = LayerDrilldown(**{**drill.__dict__, "graph_file": None})
    manifest = write_model_explorer([], tmp_path, [bare])
    entry = manifest["graphs"][1]
    graph = json.loads((tmp_path / entry["graph"]).read_text())
    jsonschema.validate(graph, GRAPH_SCHEMA)
    _graph_ids, used = _ids_used(_node_data_files(tmp_path, manifest, entry["graph"]))
    assert used <= {n["id"] for n in graph["graphs"][0]["nodes"]} and "operator table" in entry["note"]


def test_session_report_model_explorer_writes_checkpoint_graph(db, build, fx_layer, tmp_path, capsys):
    _gm, drill = fx_layer
    b = build(db, bug_layer=1, extra_results={"drilldown": [drill.to_dict()]})
    out = tmp_path / "me"
    assert main(["--session-id", b.session_id, "--database", str(db.database_path), "--model-explorer", str(out)]) == 0
    assert capsys.readouterr().out == ""  # only the Model Explorer files were asked for
    manifest = json.loads((out / "manifest.json").read_text())
    assert [g["graph"] for g in manifest["graphs"]] == ["checkpoints.json", "layer_1.json"]
    graph = json.loads((out / "checkpoints.json").read_text())
    jsonschema.validate(graph, GRAPH_SCHEMA)
    nodes = graph["graphs"][0]["nodes"]
    assert [n["id"] for n in nodes][:3] == ["post_embedding", "post_attention:0", "post_mlp:0"]
    docs = _node_data_files(out, manifest, "checkpoints.json")
    assert set(docs) == {"error", "bound", "margin", "introduced", "carried_in"}
    graph_ids, used = _ids_used(docs)
    assert graph_ids == {CHECKPOINT_GRAPH_ID} and used <= {n["id"] for n in nodes}
    error = docs["error"][CHECKPOINT_GRAPH_ID]["results"]
    first = f"{b.first[0]}:{b.first[1]}"
    assert error[first]["bgColor"] == RED and error["post_embedding"]["bgColor"] != RED
    assert docs["introduced"][CHECKPOINT_GRAPH_ID]["results"]["post_mlp:1"]["bgColor"] == RED
    culprit = next(a for n in nodes if n["id"] == "post_mlp:1" for a in n["attrs"] if a["key"] == "culprit")
    assert "aten.gelu.default" in culprit["value"]
    assert [n["id"] for n in nodes if any(a["key"] == "culprit" for a in n["attrs"])] == ["post_mlp:1"]


def test_model_explorer_option_errors(db, build, tmp_path, capsys):
    b = build(db)
    dbp = str(db.database_path)
    assert main(["--list", "--database", dbp, "--model-explorer", str(tmp_path / "x")]) == 2
    assert "--model-explorer goes with --session-id" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--session-id", b.session_id, "--database", dbp, "--model-explorer", str(blocker / "sub")]) == 2
    assert "DF005" in capsys.readouterr().err


def test_docs_example_runs(tmp_path, monkeypatch, capsys):
    import re

    doc = Path(__file__).resolve().parents[2] / "docs" / "model_explorer.md"
    blocks = re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", doc.read_text(), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out.startswith("layer_1.json ['bound', 'carried_in', 'introduced', 'margin']")
    doc_data = json.loads((tmp_path / "overlay" / "layer_1.introduced.json").read_text())
    jsonschema.validate(doc_data, NODE_DATA_SCHEMA)
    assert doc_data[PT2_GRAPH_ID]["results"]["gelu"]["bgColor"] == RED
