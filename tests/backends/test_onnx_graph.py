"""The onnxruntime backend's graph helpers, on small hand-built ONNX graphs (no export, fast):
a layer, or its MLP block, is cut out of a graph at its named boundaries (through an Identity copy
where the exporter named one), a cut that would not start at the layer's input is refused (and the
backend then says it cannot run the block alone), the exporter's chatter goes to the log instead of
the terminal, and a session's artifact root is claimed per backend."""

from __future__ import annotations

import logging
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from debug_framework.backends._onnx_graph import LayerCutError, captured_output, cut_layer  # noqa: E402
from debug_framework.backends.artifacts import artifact_root, claim_artifact_dir, current_artifact_root  # noqa: E402
from debug_framework.backends.onnxruntime.runner import OnnxRuntimeBackend  # noqa: E402
from debug_framework.capture import CheckpointKey  # noqa: E402
from debug_framework.errors import BackendInitializationError  # noqa: E402

CHECKPOINTS = ["post_embedding", "post_attention_0", "post_mlp_0", "post_attention_1", "post_mlp_1"]


def _two_layer_graph(alias_input: bool = False, attention: str = "named"):
    """x -> post_embedding = x * 2 -> per layer: attn = h + w_i * scale(mask), mlp = attn * 3.

    ``scale(mask)`` is computed once from the ``mask`` input and read by every layer (as a model's
    attention mask is). ``alias_input``: the ``post_embedding`` output is an Identity copy of the
    value layer 0 reads. ``attention``: what each layer's MLP reads: ``"named"`` the
    ``post_attention_<i>`` output itself, ``"copied"`` the value that output is an Identity copy of,
    ``"recomputed"`` a second computation of the same value (no cut can start at the output).
    """
    f32 = TensorProto.FLOAT
    hidden = "emb" if alias_input else "post_embedding"
    nodes = [helper.make_node("Mul", ["x", "two"], [hidden]), helper.make_node("ReduceSum", ["mask"], ["scale"])]
    if alias_input:
        nodes.append(helper.make_node("Identity", ["emb"], ["post_embedding"]))
    for i in range(2):
        attn = f"post_attention_{i}" if attention == "named" else f"attn{i}"
        nodes += [helper.make_node("Mul", [f"w{i}", "scale"], [f"ws{i}"]),
                  helper.make_node("Add", [hidden, f"ws{i}"], [attn])]
        if attention != "named":
            op = "Identity" if attention == "copied" else "Add"
            reads = [attn] if op == "Identity" else [hidden, f"ws{i}"]
            nodes.append(helper.make_node(op, reads, [f"post_attention_{i}"]))
        nodes.append(helper.make_node("Mul", [attn, "three"], [f"post_mlp_{i}"]))
        hidden = f"post_mlp_{i}"
    inits = [numpy_helper.from_array(np.float32(v), n) for n, v in (("two", 2.0), ("three", 3.0))]
    inits += [numpy_helper.from_array(np.full((4,), i + 1, np.float32), f"w{i}") for i in range(2)]
    vi = lambda n, shape: helper.make_tensor_value_info(n, f32, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "two-layers", [vi("x", [4]), vi("mask", [4])],
                              [vi(n, [4]) for n in CHECKPOINTS], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session, session.run(None, {k: v for k, v in feeds.items() if k in names})


def test_a_layer_cut_at_its_boundaries_replays_it_on_any_input():
    model = _two_layer_graph()
    cut = cut_layer(model, "post_mlp_0", ["post_attention_1", "post_mlp_1"], CHECKPOINTS)
    hidden, mask = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    session, (attn, mlp) = _run(cut, {"post_mlp_0": hidden, "mask": mask, "x": mask})
    assert sorted(i.name for i in session.get_inputs()) == ["mask", "post_mlp_0"]  # x is not read: layer 0 is gone
    np.testing.assert_allclose(attn, hidden + 2 * 4)  # w1 = 2, scale = sum(mask) = 4: computed inside the cut
    np.testing.assert_allclose(mlp, (hidden + 8) * 3)
    assert {n.output[0] for n in cut.graph.node}.isdisjoint({"post_embedding", "post_attention_0", "post_mlp_0"})
    first = cut_layer(model, "post_embedding", ["post_attention_0", "post_mlp_0"], CHECKPOINTS)
    np.testing.assert_allclose(_run(first, {"post_embedding": hidden, "mask": mask})[1][1], (hidden + 4) * 3)


def test_a_cut_starts_at_the_value_an_identity_output_copies():
    hidden, mask = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    aliased = cut_layer(_two_layer_graph(alias_input=True), "post_embedding", ["post_attention_0", "post_mlp_0"],
                        CHECKPOINTS)
    assert aliased.graph.input[0].name == "emb"  # what layer 0 reads, typed as post_embedding
    assert aliased.graph.input[0].type == _two_layer_graph().graph.output[0].type
    np.testing.assert_allclose(_run(aliased, {"emb": hidden, "mask": mask})[1][1], (hidden + 4) * 3)
    assert {n.op_type for n in aliased.graph.node} == {"Mul", "Add", "ReduceSum"}  # the copy is left out


@pytest.mark.parametrize(("attention", "start"), [("named", "post_attention_1"), ("copied", "attn1")])
def test_an_mlp_block_is_cut_from_its_post_attention_state(attention, start):
    cut = cut_layer(_two_layer_graph(attention=attention), "post_attention_1", ["post_mlp_1"], CHECKPOINTS)
    hidden = np.arange(4, dtype=np.float32)
    session, (mlp,) = _run(cut, {start: hidden, "mask": np.ones(4, np.float32)})
    assert [i.name for i in session.get_inputs()] == [start]  # no mask, no attention: the block alone
    np.testing.assert_allclose(mlp, hidden * 3)


def _backend_on(graph) -> OnnxRuntimeBackend:
    """An onnxruntime backend as ``prepare`` leaves it for a two-layer model exported as ``graph``."""
    from types import SimpleNamespace

    backend = OnnxRuntimeBackend()
    backend.model = SimpleNamespace(num_layers=2)
    keys = [CheckpointKey("post_embedding")]
    keys += [CheckpointKey(n, i) for i in range(2) for n in ("post_attention", "post_mlp")]
    backend._names = {k: str(k).replace(":", "_") for k in keys}
    assert list(backend._names.values()) == CHECKPOINTS
    backend._graph_proto = graph
    return backend


def test_the_backend_says_why_it_cannot_run_an_mlp_block_alone():
    assert _backend_on(_two_layer_graph(attention="copied")).can_run_block() == (True, "")
    backend = _backend_on(_two_layer_graph(attention="recomputed"))
    ok, why = backend.can_run_block()
    assert not ok and why == ("cannot cut layer 0's MLP block out of its export: "
                              "no node computing post_mlp_0 reads 'post_attention_0'")
    with pytest.raises(BackendInitializationError, match="cannot run the MLP block alone: cannot cut layer 0"):
        backend.run_block(1, "mlp", np.zeros(4, np.float32), None)


def test_a_cut_that_would_not_start_at_the_layer_input_is_refused():
    with pytest.raises(LayerCutError, match="reads 'post_attention_0'"):
        cut_layer(_two_layer_graph(attention="recomputed"), "post_attention_0", ["post_mlp_0"], CHECKPOINTS)
    with pytest.raises(LayerCutError, match="still computes post_attention_0, post_mlp_0"):
        cut_layer(_two_layer_graph(), "post_embedding", ["post_attention_1", "post_mlp_1"], CHECKPOINTS)
    with pytest.raises(LayerCutError, match="post_mlp_7 not among the graph's outputs"):
        cut_layer(_two_layer_graph(), "post_mlp_0", ["post_mlp_7"], CHECKPOINTS)


def test_captured_output_keeps_the_exporters_chatter_in_the_log(tmp_path, capfd):
    torch_like = logging.getLogger("torch.onnx._test_exporter")
    printer = logging.StreamHandler()  # as torch gives torch.onnx its own stderr handler
    torch_like.addHandler(printer)
    torch_like.propagate = False
    log = tmp_path / "export.log"
    try:
        with captured_output(log, "export of model.onnx"):
            torch_like.warning("torchvision is not installed")
            warnings.warn("LeafSpec is deprecated", FutureWarning, stacklevel=1)
            print("prepare 2/10", file=sys.stderr)  # a progress bar drawn meanwhile stays on the terminal
        out, err = capfd.readouterr()
        assert out == "" and err == "prepare 2/10\n"
        assert torch_like.handlers == [printer] and not torch_like.propagate  # restored after the block
        torch_like.warning("after the block")
        assert "after the block" in capfd.readouterr().err
    finally:
        torch_like.removeHandler(printer)
    text = log.read_text()
    assert text.startswith("== export of model.onnx (") and "after the block" not in text and "prepare" not in text
    for line in ("WARNING torch.onnx._test_exporter: torchvision is not installed",
                 "FutureWarning: LeafSpec is deprecated"):
        assert line in text, text


def test_artifact_root_is_claimed_per_backend_and_unset_outside(tmp_path):
    assert current_artifact_root() is None and claim_artifact_dir("onnxruntime") is None
    with artifact_root(tmp_path / "s1") as root:
        assert root == tmp_path / "s1" and current_artifact_root() == root
        assert claim_artifact_dir("onnxruntime") == root / "onnxruntime"
        assert claim_artifact_dir("onnxruntime") == root / "onnxruntime-2"  # a second one in the session
    assert current_artifact_root() is None and (tmp_path / "s1" / "onnxruntime-2").is_dir()
