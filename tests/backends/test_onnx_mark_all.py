"""``mark_all``'s parts on small values: the streamed NumPy evaluation, the valid positions and
what is (not) an error (services/validation/mark_all.py). The whole comparison on an ONNX export is
in tests/backends/test_onnx_file.py (an injected bug, a float16 file)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from debug_framework.services.validation.mark_all import compare_value, numpy_stream, valid_mask  # noqa: E402


def _chain() -> onnx.ModelProto:
    """x -> Erf -> Add(x) -> Mul -> Tanh: four values in topological order."""
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])
    nodes = [helper.make_node("Erf", ["x"], ["a"]), helper.make_node("Add", ["a", "x"], ["b"]),
             helper.make_node("Mul", ["b", "w"], ["c"]), helper.make_node("Tanh", ["c"], ["y"])]
    w = numpy_helper.from_array(np.full((2, 3), 0.5), "w")
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[w]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_the_numpy_stream_yields_each_chunk_as_the_evaluator_computes_it():
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(_chain())
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    whole = ev.run(None, {"x": x}, intermediate=True)
    chunks = [["a", "b"], ["c"], ["y"]]
    got = list(numpy_stream(ev, {"x": x}, chunks))
    assert [sorted(c) for c in got] == [sorted(c) for c in chunks]
    for chunk in got:
        for name, value in chunk.items():
            np.testing.assert_array_equal(value, whole[name])


def test_valid_positions_follow_the_attention_mask():
    mask = np.array([[1, 1, 1], [0, 1, 1]])
    assert valid_mask((2, 3, 4), np.ones((2, 3))) is None  # nothing padded
    hidden = valid_mask((2, 3, 4), mask)
    assert hidden.shape == (2, 3, 4) and not hidden[1, 0].any() and hidden[1, 1:].all() and hidden[0].all()
    scores = valid_mask((2, 5, 3, 3), mask)  # [B, heads, T, T]: both sequence axes
    assert not scores[1, :, 0, :].any() and not scores[1, :, :, 0].any() and scores[1, :, 1:, 1:].all()
    assert valid_mask((4, 3), mask) is None  # not batch-first


def test_what_is_and_is_not_an_error():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 3, 4))
    rounded = ref.astype(np.float16)
    # a correct float16 run: within the bound the calibration's own float16 rounding sets
    assert compare_value(ref, rounded, rounded, None, "float16", 4.0, 1.0)[3]
    # a real error fails
    assert not compare_value(ref, (ref * 1.1).astype(np.float16), rounded, None, "float16", 4.0, 1.0)[3]
    # the mask's constant: float32's finfo.min in the reference, float16's (or -inf) in the file
    big = np.where(np.arange(12).reshape(3, 4) % 2 == 0, -3.4028234663852886e38, 0.0)
    for saturated in (np.float16(-65504), -np.inf):
        alt = np.where(big < 0, saturated, 0.0).astype(np.float16)
        assert compare_value(big, alt, alt, None, "float16", 4.0, 1.0)[3]
    assert not compare_value(big, np.zeros_like(big, dtype=np.float16), big, None, "float16", 4.0, 1.0)[3]
    # garbage at padded positions is not compared
    mask = np.array([[1, 1, 1], [0, 1, 1]])
    junk = ref.copy()
    junk[1, 0] = 1e4
    assert not compare_value(ref, junk, ref, None, "float32", 4.0, 1.0)[3]
    assert compare_value(ref, junk, ref, valid_mask(ref.shape, mask), "float32", 4.0, 1.0)[3]
    # near-zero values: judged by RMSE against the calibrated bound, not relative to themselves
    tiny = ref * 1e-12
    assert compare_value(tiny, tiny.astype(np.float32) * (1 + 1e-7), tiny.astype(np.float32), None, "float32",
                         4.0, 1.0)[3]
    # a shape mismatch or a NaN where the reference is finite fails
    assert not compare_value(ref, ref[:1], ref, None, "float32", 4.0, 1.0)[3]
    nan = ref.copy()
    nan[0, 0, 0] = np.nan
    assert not compare_value(ref, nan, ref, None, "float32", 4.0, 1.0)[3]


def test_a_float16_conversion_that_breaks_an_output_read_inside_the_graph_is_explained(tmp_path):
    """onnxconverter_common's float16 conversion keeping float32 outputs casts an output back to
    float32 while a node inside still reads it (a BERT's pooler reading the last hidden state):
    ONNX Runtime refuses the file; the error names the output, its readers and both fixes."""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    ort = pytest.importorskip("onnxruntime")
    from debug_framework.backends._onnx_file import float16_output_conflicts, load_error

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4])
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4])
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Tanh", ["h"], ["p"], name="pool")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [h, p], initializer=[w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert float16_output_conflicts(model) == {}
    for keep, block in ((True, None), (False, None), (True, ["pool"])):
        converted = float16.convert_float_to_float16(model, keep_io_types=keep, node_block_list=block)
        path = tmp_path / f"fp16-{keep}-{block}.onnx"
        onnx.save(converted, str(path))
        if keep and block is None:  # broken: named, with both fixes
            assert float16_output_conflicts(converted) == {"h": ["pool"]}
            with pytest.raises(Exception) as info:
                ort.InferenceSession(str(path))
            err = load_error(info.value, path, None, "onnxruntime")
            assert "'h' (read by 'pool')" in err.message and "keep_io_types=False" in err.hint
            assert "node_block_list" in err.hint
        else:  # either fix loads and runs
            assert float16_output_conflicts(converted) == {}
            x_type = np.float32 if keep else np.float16
            ort.InferenceSession(str(path)).run(None, {"x": np.ones((2, 4), dtype=x_type)})


def test_the_runners_of_a_file_share_one_float32_copy_and_cast_it_on_use(tmp_path):
    """Two runners of one file (float64, bfloat16) get the same float32 arrays (read once); each
    graph casts a weight right before its reader: float64 exactly, bfloat16 rounded as
    ``_bf16_round`` rounds; ONNX's NumPy evaluator runs it streamed."""
    from onnx.reference import ReferenceEvaluator

    from debug_framework.backends._onnx_file import _bf16_round, runner_graph
    from debug_framework.backends._onnx_weights import FedSession

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)  # 16 KiB: fed, not kept in the graph
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("MatMul", ["t", "w"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[numpy_helper.from_array(w, "w")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    p64, feeds64, shared64 = runner_graph(path, [], "float64")
    pbf, feedsbf, sharedbf = runner_graph(path, [], "bfloat16")
    assert shared64 is sharedbf and feeds64 == {"w__f32": shared64["w"]} and feeds64["w__f32"] is feedsbf["w__f32"]
    assert [n.op_type for n in p64.graph.node] == ["Tanh", "Cast", "MatMul"]  # the cast right before its reader
    xv = rng.standard_normal((2, 64))
    got64 = FedSession(ReferenceEvaluator(p64), feeds64).run(["y"], {"x": xv})[0]
    assert got64.dtype == np.float64
    np.testing.assert_array_equal(got64, np.tanh(xv) @ w.astype(np.float64))
    xf = xv.astype(np.float32)
    gotbf = FedSession(ReferenceEvaluator(pbf), feedsbf).run(["y"], {"x": xf})[0]
    want = _bf16_round(_bf16_round(np.tanh(xf)) @ _bf16_round(w))  # every value and the weight rounded
    assert not np.array_equal(gotbf, np.tanh(xf) @ w)
    np.testing.assert_array_equal(gotbf, want)
