"""The ONNX Runtime drill-down strategy, driven directly with DrillRequests (not through the stage).

Acceptance: an ONNX Runtime backend whose graphs pass through a transform that computes ``Gelu``
with the tanh approximation -> the drill names that node, its ATen op and module path, and writes
a repro that runs alone and exits 1 (0 once the bug is gone); the correct backend -> no culprit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from debug_framework.errors import BackendInitializationError, ValidationError  # noqa: E402
from debug_framework.backends.onnxruntime.drilldown import OnnxDrillStrategy  # noqa: E402
from debug_framework.backends.drilldown.onnx_graph import (  # noqa: E402
    node_origin,
    single_node_model,
    to_float64,
    value_infos,
    value_types,
)
from debug_framework.services.drilldown.types import DrillRequest  # noqa: E402

GELU_TANH = f"{Path(__file__).with_name('buggy_onnx.py')}:gelu_tanh"
LAYER = 1  # conftest's bert_layer fixture gives the reference's input to this layer (DRILLED_LAYER)


def _drill(bert_layer, tmp_path, **options):
    from debug_framework.backends import get_backend

    model, inputs, hidden = bert_layer
    backend = get_backend("onnxruntime", artifact_dir=tmp_path / "art", **options)
    backend.prepare(model, "float32", "cpu")
    request = DrillRequest(layer=LAYER, checkpoint=f"post_mlp:{LAYER}", backend=backend, model=model, inputs=inputs,
                           hidden_in=hidden, dtype="float32", device="cpu", out_dir=tmp_path / "drill")
    return OnnxDrillStrategy().drill(request)


@pytest.mark.slow
def test_a_corrupted_node_is_named_with_its_module_path_and_a_verified_repro(bert_layer, tmp_path):
    import onnx

    drill = _drill(bert_layer, tmp_path, graph_transform=GELU_TANH)
    culprit = drill.culprit
    assert culprit is not None and drill.method == "onnx"
    assert culprit.op == "Gelu (aten.gelu.default)"
    assert culprit.module_path == f"encoder.layer.{LAYER}.intermediate.intermediate_act_fn"
    assert culprit.source.startswith("activations.py:")
    assert [r.node for r in drill.introducing] == [culprit.node]  # the carriers after it are not blamed
    gelu = next(r for r in drill.operators if r.node == culprit.node)
    after = [r for r in drill.operators if r.index > gelu.index]
    assert gelu.margin > 10 and all(r.carried_in > gelu.bound for r in after)
    # node ids are the exported layer graph's node names (what the Model Explorer overlay keys on)
    graph = onnx.load(drill.graph_file)
    assert {r.node for r in drill.operators} <= {n.name for n in graph.graph.node}
    # the repro runs alone, exits 1 while the bug is there, 0 without the transform
    assert culprit.verified
    repro = Path(culprit.repro_dir)
    assert {"repro.py", "node.onnx", "expected.npy", "repro.json"} <= {p.name for p in repro.iterdir()}
    assert not list(repro.glob("*.pkl")) and not list(repro.glob("*.pt"))
    run = subprocess.run([sys.executable, str(repro / "repro.py")], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("REPRO: reproduced: ONNX node")
    spec = (repro / "repro.json").read_text().replace('"graph_transform:gelu_tanh"', "null")
    (repro / "repro.json").write_text(spec)
    assert subprocess.run([sys.executable, str(repro / "repro.py")], capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_correct_backend_has_no_culprit(bert_layer, tmp_path):
    drill = _drill(bert_layer, tmp_path)
    assert drill.culprit is None and not drill.introducing
    assert len(drill.operators) >= 20 and all(r.bound > 0 and r.introduced >= 0 for r in drill.operators)
    assert "no ONNX node introduces error" in drill.note
    assert all(r.module_path.startswith(f"encoder.layer.{LAYER}") for r in drill.operators)


def test_applies_only_to_a_prepared_onnx_runtime_backend():
    from debug_framework.backends import get_backend

    strategy = OnnxDrillStrategy()
    assert strategy.applies(get_backend("pytorch"))[0] is False
    ok, why = strategy.applies(get_backend("onnxruntime"))
    assert not ok and "not prepared" in why
    request = DrillRequest(layer=0, checkpoint="post_mlp:0", backend=get_backend("pytorch"), model=None, inputs=None,
                           hidden_in=np.zeros((1, 2, 4)), dtype="float32", device="cpu", out_dir=Path("unused"))
    with pytest.raises(ValidationError, match="not ONNX Runtime"):
        strategy.drill(request)


def _node_with_origin():
    import onnx

    node = onnx.helper.make_node("Gelu", ["x"], ["y"], name="node_gelu")
    for key, value in {
        "pkg.torch.onnx.fx_node": "%gelu : [num_users=1] = call_function[target=torch.ops.aten.gelu.default](args = (%x,))",
        "pkg.torch.onnx.name_scopes": "['', 'layer', 'layer.intermediate', 'layer.intermediate.act', 'gelu']",
        "pkg.torch.onnx.stack_trace": 'File "/a/b/model.py", line 10, in forward\n  File "/c/activations.py", line 89, in f',
    }.items():
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value
    return node


def test_node_origin_reads_the_exporters_metadata():
    origin = node_origin(_node_with_origin())
    assert (origin.aten, origin.module_path, origin.source) == ("aten.gelu.default", "layer.intermediate.act", "activations.py:89")
    import onnx

    assert node_origin(onnx.helper.make_node("Relu", ["x"], ["y"])) == type(origin)()


def test_float64_copy_and_single_node_model_keep_integers_and_types():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    nodes = [helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["x", "w"], ["xw"], name="mul"), helper.make_node("Add", ["xw", "m"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              initializer=[numpy_helper.from_array(np.array([1 / 3, 3.0], np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    infos = value_infos(model)
    types = value_types(infos)
    assert types["m"] == TensorProto.FLOAT and types["mask"] == TensorProto.INT64
    wide = to_float64(model)
    out = ReferenceEvaluator(wide).run(None, {"x": np.array([1 / 3, 2.0]), "mask": np.array([0, 1])})[0]
    w = float(np.float32(1 / 3))
    assert out.dtype == np.float64 and out[0] == (1 / 3) * w and out[1] == 2.0 * 3.0 + 1  # float64 arithmetic
    assert np.float32(out[0]) != out[0]
    single = single_node_model(model, nodes[2], infos)
    onnx.checker.check_model(single)
    assert [i.name for i in single.graph.input] == ["xw", "m"] and single.graph.output[0].name == "y"


def test_a_bad_graph_transform_is_a_df002(tmp_path):
    from debug_framework.backends._user_function import load_user_function

    for spec, message in (("no_colon", "does not name"), (f"{tmp_path}/missing.py:f", "cannot load"),
                          (f"{Path(__file__).with_name('buggy_onnx.py')}:nope", "no function")):
        with pytest.raises(BackendInitializationError, match=message) as info:
            load_user_function(spec, "onnxruntime", "graph_transform")
        assert info.value.code == "DF002" and "graph_transform" in str(info.value)
    assert load_user_function(GELU_TANH, "onnxruntime", "graph_transform").__name__ == "gelu_tanh"


def test_an_unmeasurable_error_is_infinite_never_nan():
    from debug_framework.backends.drilldown.onnx import _rmse

    ones = np.ones((2, 3))
    assert _rmse(ones, np.ones((3, 2), np.float32)) == np.inf  # shapes differ
    assert _rmse(ones, np.full((2, 3), np.nan, np.float32)) == np.inf  # no finite pair
    one_nan = np.ones((2, 3), np.float32)
    one_nan[0, 1] = np.nan
    assert _rmse(ones, one_nan) == np.inf
    assert _rmse(np.full(3, np.nan), np.full(3, np.nan, np.float32)) == 0.0  # NaN where float64 has NaN: no error
    assert _rmse(np.array([-1e300, 1.0]), np.array([-np.inf, 1.0], np.float32)) == 0.0  # float32's rounding of -1e300
    assert _rmse(np.array([1e300, 1.0]), np.array([-np.inf, 1.0], np.float32)) == np.inf
    assert _rmse(np.array([0.0, 2.0]), np.array([0.0, 0.0], np.float32)) == pytest.approx(np.sqrt(2.0))


def test_a_nan_margin_on_one_output_neither_hides_nor_passes_a_failing_one():
    from debug_framework.backends.drilldown.onnx import _worst_output

    failing, unmeasurable, passing = (5.0, 1.0, "y0"), (np.inf, np.inf, "y1"), (0.5, 1.0, "y2")
    for order in ([failing, unmeasurable, passing], [unmeasurable, failing, passing], [passing, unmeasurable, failing]):
        assert _worst_output(order) == failing  # the real failure is reported, whichever output comes first
    assert _worst_output([passing, unmeasurable])[2] == "y1"  # unmeasurable outranks a pass (the row shows NaN)
    assert _worst_output([(0.0, 0.0, "z"), passing]) == passing


def _write_add_repro(tmp_path, *, expected, node="add", op="Add", graph_transform=None):
    from onnx import TensorProto, helper

    from debug_framework.backends.onnxruntime.repro import write_onnx_repro

    add = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("a", "b")]
    graph = helper.make_graph([add], "g", value, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}
    return write_onnx_repro(tmp_path, node=node, op=op, model=model, feeds=feeds, output="y", expected=expected,
                            bound=1e-6, optimization="ORT_DISABLE_ALL", providers=["CPUExecutionProvider"],
                            graph_transform=graph_transform)


def test_an_onnx_repro_that_crashes_is_not_verified(tmp_path):
    from debug_framework.repro_format import verify

    wrong = np.full(3, 3.0)  # 1 + 1 is not 3: the repro reproduces
    assert verify(_write_add_repro(tmp_path / "real", expected=wrong)).reproduced
    assert not verify(_write_add_repro(tmp_path / "right", expected=np.full(3, 2.0))).reproduced
    crashing = _write_add_repro(tmp_path / "crash", expected=wrong, graph_transform="no_such_module_xyz:f")
    res = verify(crashing)  # ModuleNotFoundError: the check cannot run (exit 2), nothing reproduced
    assert not res.reproduced and res.returncode == 2 and res.verdict == "error"
    assert "ModuleNotFoundError" in (crashing / "verify.log").read_text()


def test_a_hostile_node_name_cannot_break_out_of_the_repro_docstring(tmp_path):
    import ast

    from debug_framework.repro_format import verify

    hostile = 'n"""\nraise SystemExit(1)  # \\\n"""'
    repro = _write_add_repro(tmp_path, expected=np.full(3, 2.0), node=hostile, op="Add'''\"")
    tree = ast.parse((repro / "repro.py").read_text())
    assert isinstance(tree.body[0], ast.Expr) and "raise" not in [type(n).__name__.lower() for n in tree.body]
    assert not any(isinstance(n, ast.Raise) for n in tree.body)
    assert not verify(repro).reproduced  # a correct node: runs to its verdict (exit 0), not an injected exit 1
    assert "REPRO: fixed: ONNX node" in (repro / "verify.log").read_text()


def test_carried_in_counts_only_values_computed_from_the_hidden_input():
    from onnx import TensorProto, helper

    from debug_framework.backends.drilldown.onnx import derived_from

    nodes = [helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["m", "w"], ["mw"], name="scale_mask"),
             helper.make_node("Mul", ["hidden", "w"], ["xw"], name="mul"),
             helper.make_node("Add", ["xw", "mw"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, [2]),
                                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert derived_from(helper.make_model(graph), "hidden") == {"hidden", "xw", "y"}  # not m, mw, w, mask
