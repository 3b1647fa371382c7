"""An ONNX file as ``--model-path``: layers from the graph's name scopes, a float64 reference of
the same graph, onnxruntime and openvino as the alternative, an injected bug localized to its layer."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from debug_framework.errors import ModelLoadingError  # noqa: E402
from debug_framework.modelio import load_model  # noqa: E402
from debug_framework.modelio.onnx_file import layer_of_scope  # noqa: E402
from debug_framework.services.validation_engine import ValidationEngine  # noqa: E402


def test_layer_scopes_of_both_exporters():
    assert layer_of_scope("encoder.layer.3.attention") == 3
    assert layer_of_scope("model.layers.12") == 12
    assert layer_of_scope("encoder/layer.0/attention/self") == 0
    assert layer_of_scope("embeddings.LayerNorm") is None
    assert layer_of_scope("player.2") is None


def test_a_graph_without_token_inputs_is_df004(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="/layers.0/Relu")], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), str(path))
    with pytest.raises(ModelLoadingError, match="input_ids required"):
        load_model(path)
    path.write_bytes(b"not onnx")
    with pytest.raises(ModelLoadingError, match="not a readable ONNX file"):
        load_model(path)


def _legacy_graph(path: Path) -> Path:
    """A two-layer token model with legacy node names (``/model/layers.N/...``): an embedding
    ``Gather``, then per layer ``Erf`` (no float64 kernel in ONNX Runtime) and a residual ``Add``."""
    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((50, 4)).astype(np.float32), "embed.weight")
    nodes = [helper.make_node("Gather", ["embed.weight", "input_ids"], ["h0"], name="/model/embed_tokens/Gather")]
    for i in range(2):
        nodes += [helper.make_node("Erf", [f"h{i}"], [f"e{i}"], name=f"/model/layers.{i}/mlp/Erf"),
                  helper.make_node("Add", [f"h{i}", f"e{i}"], [f"h{i + 1}"], name=f"/model/layers.{i}/Add")]
    nodes.append(helper.make_node("Mul", ["h2", "h2"], ["out"], name="/model/norm/Mul"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "t", 4])], initializer=[emb])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_legacy_names_and_a_float64_reference_without_onnxruntime_kernels(tmp_path):
    """Checkpoints from ``/model/layers.N/`` node names; ONNX Runtime has no float64 ``Erf``, so the
    reference runs the float64 graph in ONNX's NumPy evaluator, and says so."""
    from debug_framework.backends.python_reference import PythonReferenceBackend
    from debug_framework.capture import CheckpointKey
    from debug_framework.modelio import ModelInputs

    model = load_model(_legacy_graph(tmp_path / "m.onnx"))
    assert model.config.checkpoint_tensors == {"post_embedding": "h0", "post_mlp:0": "h1", "post_mlp:1": "h2",
                                               "post_processing": "out"}
    assert model.config.vocab_size == 50 and model.num_layers == 2
    ref = PythonReferenceBackend()
    ref.prepare(model, "float64")
    inputs = ModelInputs.random(50, 2, 5, seed=0, pad_lengths=[0, 1])
    cap = ref.run(inputs, [CheckpointKey("post_mlp", 1), CheckpointKey("post_processing")])
    assert cap.meta["runtime"] == "onnx.reference" and "Erf" in cap.meta["fallback_reason"]
    out = cap[CheckpointKey("post_processing")]
    assert out.dtype == np.float64 and out.shape == (2, 5, 4)
    from math import erf

    h = numpy_helper.to_array(onnx.load(str(tmp_path / "m.onnx")).graph.initializer[0]).astype(np.float64)[
        inputs.input_ids]
    for _ in range(2):
        h = h + np.vectorize(erf)(h)
    np.testing.assert_allclose(out, h * h, rtol=1e-13)  # float64 all the way: not a float32 run


def test_the_automatic_reference_of_an_onnx_file_is_its_graph_in_float64(tmp_path):
    """``--reference-backend auto`` (the CLI's default) on an ONNX file: python_reference, said so."""
    from debug_framework.backends.eager_reference import reference_for

    name, why = reference_for("auto", load_model(_legacy_graph(tmp_path / "m.onnx")))
    assert name == "python_reference" and "ONNX file's own graph" in why


def test_backends_that_build_from_weights_refuse_an_onnx_file(tmp_path):
    from debug_framework.backends.pytorch import PyTorchBackend
    from debug_framework.errors import BackendInitializationError

    model = load_model(_legacy_graph(tmp_path / "m.onnx"))
    with pytest.raises(BackendInitializationError, match="cannot run an ONNX file"):
        PyTorchBackend().prepare(model, "float32")


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory) -> Path:
    """A tiny random BERT exported by torch.onnx (dynamo; name-scope metadata), external data beside it."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    net = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    kw = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long),
          "token_type_ids": torch.zeros(2, 8, dtype=torch.long)}
    path = tmp_path_factory.mktemp("onnxfile") / "bert.onnx"
    dyn = torch.export.Dim.DYNAMIC
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (), str(path), kwargs=kw, input_names=names, output_names=["last_hidden_state"],
                          dynamic_shapes={k: {0: dyn, 1: dyn} for k in names}, dynamo=True, verbose=False,
                          external_data=True)
    return path


def _validate(tmp_path: Path, model: Path, alternative: str, **config) -> dict:
    engine = ValidationEngine(tmp_path / "db.sqlite")
    sid = engine.create_session(model, {"input_shape": [2, 8], **config}, "python_reference", alternative)
    return engine.run(sid).to_dict()


def test_the_default_checkpoints_are_the_boundaries_the_graph_has(tmp_path):
    """A graph without ``post_attention`` boundaries validates with the default checkpoints: only
    those it has are asked for (none reported missing); a checkpoint named explicitly still is."""
    from debug_framework.services.validation.plan import enabled_keys, model_checkpoints

    path = _legacy_graph(tmp_path / "m.onnx")
    available = model_checkpoints(load_model(path))
    assert [str(k) for k in enabled_keys({}, 2, (), available)] == ["post_embedding", "post_mlp:0", "post_mlp:1",
                                                                     "post_processing"]
    assert "post_attention:0" in [str(k) for k in enabled_keys({"enabled_checkpoints": ["post_attention"]}, 2, (),
                                                                available)]
    result = _validate(tmp_path, path, "onnxruntime", isolate=False, calibrate=False)
    assert result["verdict"] == "passed", result["failed"]
    assert [r["id"] for r in result["results"]] == ["post_embedding", "post_mlp:0", "post_mlp:1", "post_processing"]


@pytest.mark.slow
def test_an_onnx_file_validates_against_onnxruntime_and_openvino(bert_onnx, tmp_path):
    model = load_model(bert_onnx)
    assert model.format == "onnx" and model.num_layers == 2 and model.config.vocab_size == 100
    assert set(model.config.checkpoint_tensors) == {"post_embedding", "post_attention:0", "post_mlp:0",
                                                    "post_attention:1", "post_mlp:1", "post_processing"}
    assert len(model.files) == 2  # the external data file is part of the digest
    result = _validate(tmp_path, bert_onnx, "onnxruntime")
    assert result["verdict"] == "passed", result["failed"]
    assert len(result["results"]) == 6 and all(r["passed"] for r in result["results"])
    tensors = model.config.checkpoint_tensors  # each checkpoint's graph tensor is its module path
    assert [r["module"] for r in result["results"]] == [tensors[r["id"]] for r in result["results"]]
    try:
        import openvino  # noqa: F401
    except ImportError:
        return
    # every node output compared too (--mark-all): OpenVINO compiles the graph with each one marked
    result = _validate(tmp_path, bert_onnx, "openvino", alternative_options={"precision_hint": "f32"},
                       mark_all=True, pad_lengths=[0, 3])
    assert result["verdict"] == "passed", result["failed"]
    assert result["mark_all"]["compared"] > 50 and result["mark_all"]["failed"] == 0, result["mark_all"]["failures"][:3]
    # the bf16 hint forced (emulated where the CPU has no bfloat16): named, and passing at bfloat16
    bf16 = {"alternative_options": {"precision_hint": "bf16"}}
    result = _validate(tmp_path, bert_onnx, "openvino", **bf16)
    # bfloat16 where emulated; where the CPU computes bfloat16 natively its accumulations stay float32,
    # a mixed precision no correct half-precision run matches (tests/backends/test_openvino.py)
    assert result["verdict"] == "failed" and result["consistent_with"] in ("bfloat16", "float16", None)
    result = _validate(tmp_path, bert_onnx, "openvino", dtype="bfloat16", mark_all=True, **bf16)
    assert result["verdict"] == "passed", result["failed"]
    assert result["mark_all"]["compared"] > 50 and result["mark_all"]["failed"] == 0, result["mark_all"]["failures"][:3]


@pytest.mark.slow
def test_an_fp16_converted_file_is_named_float16_and_passes_at_float16(bert_onnx, tmp_path):
    from onnxconverter_common import float16

    fp16 = tmp_path / "bert-fp16.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx.save(float16.convert_float_to_float16(onnx.load(str(bert_onnx)), keep_io_types=True), str(fp16))
    options = {"alternative_options": {"model_file": str(fp16)}}
    at32 = _validate(tmp_path, bert_onnx, "onnxruntime", drill_down=True, **options)
    assert at32["verdict"] == "failed" and at32["consistent_with"] == "float16"
    assert at32["precision_diagnosis"]["measured"] == ["float16", "bfloat16"]
    # drilled at the file's own float16 (its layer reads float16): beyond what a correct float16 run of
    # the session's file gives is only the mask's Where, whose -3.4e38 the converter clamped to -1e4;
    # the Cast it added on the output has no twin in the session's file and is said not judged
    drilled = at32["drilldown"]
    assert drilled and all("could not be drilled" not in (d["note"] or "") for d in drilled), drilled
    assert {d["culprit"]["op"].split()[0] for d in drilled} == {"Where"}
    assert "added by a conversion" in drilled[-1]["note"]
    # every node output too, with the second row padded: no false alarm on the mask's constant
    # (float32's finfo.min where the file has float16's), on padded positions or near zero
    at16 = _validate(tmp_path, bert_onnx, "onnxruntime", dtype="float16", mark_all=True, pad_lengths=[0, 3], **options)
    assert at16["verdict"] == "passed", at16["failed"]
    assert at16["mark_all"]["compared"] > 50 and at16["mark_all"]["failed"] == 0, at16["mark_all"]["failures"][:3]
    # dtype auto: the file's own precision (its weights are float16), declared by the backend
    auto = _validate(tmp_path, bert_onnx, "onnxruntime", dtype="auto", isolate=False, **options)
    assert auto["verdict"] == "passed" and auto["alternative_dtype"] == "float16", auto["failed"]


@pytest.mark.slow
def test_an_injected_bug_is_localized_to_its_layer(bert_onnx, tmp_path):
    """The alternative file's layer 1 attention scale multiplied by 1.5: layer 0 and the embedding
    stay within bounds (also with the padded positions of the second row); layer 1 fails, the bug is
    not called a lower precision, and the drill-down names the node (the trusted values are the
    session's own file's, matched by tensor name)."""
    m = onnx.load(str(bert_onnx))
    changed, bad_node = 0, None
    for node in m.graph.node:
        scopes = {p.key: p.value for p in node.metadata_props}.get("pkg.torch.onnx.name_scopes", "")
        if node.op_type == "Mul" and "encoder.layer.1.attention" in scopes and not changed:
            for i, name in enumerate(node.input):
                init = next((t for t in m.graph.initializer if t.name == name), None)
                if init is not None and init.data_type == TensorProto.FLOAT:
                    bad = numpy_helper.to_array(init) * np.float32(1.5)  # a copy: constants are shared by layers
                    m.graph.initializer.append(numpy_helper.from_array(bad, name + "_buggy"))
                    node.input[i] = name + "_buggy"
                    changed, bad_node = changed + 1, node.name
                    break
    assert changed == 1
    path = tmp_path / "buggy.onnx"
    onnx.save(m, str(path))
    result = _validate(tmp_path, bert_onnx, "onnxruntime", alternative_options={"model_file": str(path)},
                       drill_down=True, mark_all=True)
    verdicts = {(r["checkpoint"], r["layer"]): r["passed"] for r in result["results"]}
    assert result["verdict"] == "failed"
    assert verdicts[("post_embedding", None)] and verdicts[("post_attention", 0)] and verdicts[("post_mlp", 0)]
    assert not verdicts[("post_attention", 1)]
    assert result["first_divergence"]["id"] == "post_attention:1" and result["consistent_with"] is None
    # isolation: each layer cut out of the file and replayed on the reference's input, by the
    # alternative and by the calibration's graph: the error is introduced at layer 1 only
    assert result["introducing_layers"] == [1]
    layers = {lay["layer"]: lay for lay in result["isolation"]}
    assert layers[0]["introduces_error"] is False and layers[1]["introduces_error"] is True
    assert layers[1]["block"] == "attention" and layers[1]["mlp"] is not None
    # every node output compared in topological order: the first over its bound is the bug's
    marked = result["mark_all"]
    assert marked["first_divergence"]["node"] == bad_node and marked["first_divergence"]["layer"] == 1
    assert all(f["layer"] in (1, None) for f in marked["failures"]) and marked["compared"] > 50
    [drilled] = result["drilldown"]
    assert drilled["layer"] == 1 and drilled["culprit"]["node"] == bad_node
    assert drilled["culprit"]["module_path"].startswith("encoder.layer.1.attention") and drilled["culprit"]["verified"]


@pytest.mark.slow
def _llama_export(tmp: Path) -> Path:
    """A tiny random Llama (causal mask, rotary positions, GQA) exported by torch.onnx (dynamo)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                                   use_cache=False)
    net = transformers.LlamaForCausalLM(cfg).eval()
    names = ["input_ids", "attention_mask"]
    kw = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    path = tmp / "llama.onnx"
    dyn = torch.export.Dim.DYNAMIC
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (), str(path), kwargs=kw, input_names=names, output_names=["logits"],
                          dynamic_shapes={k: {0: dyn, 1: dyn} for k in names}, dynamo=True, verbose=False)
    return path


def test_a_llama_export_validates_with_padding(tmp_path_factory):
    """A tiny random Llama exported by torch.onnx: every checkpoint found from the
    ``model.layers.N`` scopes, and a pass with the second row left-padded (no false alarm at padded
    positions or on the mask's constants)."""
    names = ["input_ids", "attention_mask"]
    tmp = tmp_path_factory.mktemp("llama")
    path = _llama_export(tmp)
    model = load_model(path)
    assert model.num_layers == 2 and set(model.config.input_names) == set(names)
    assert {"post_embedding", "post_attention:1", "post_mlp:1"} <= set(model.config.checkpoint_tensors)
    result = _validate(tmp, path, "onnxruntime", pad_lengths=[0, 3])
    assert result["verdict"] == "passed", result["failed"]
    assert all(r["passed"] for r in result["results"]) and len(result["results"]) == 6


def test_a_float16_conversion_onnx_runtime_refuses_is_named_in_the_users_file(tmp_path):
    """issue 48, item 4: convert_float_to_float16(keep_io_types=True) of a Llama export keeps the
    exporter's cast of the rotary positions to float32 (``_to_copy``) while declaring its value
    float16; ONNX Runtime refuses the file. The error names the user's file (not the tool's
    checkpoint copy), the Cast node, and the node_block_list that converts it right, which loads and
    validates (consistent with float16 at float32)."""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    from debug_framework.backends._onnx_file import float16_cast_conflicts
    from debug_framework.errors import BackendInitializationError

    path = _llama_export(tmp_path)
    broken = float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    casts = float16_cast_conflicts(broken)
    assert casts and all(node.startswith("node__to_copy") for node in casts.values())
    user = tmp_path / "llama-fp16.onnx"
    onnx.save(broken, str(user))
    with pytest.raises(BackendInitializationError) as info:
        _validate(tmp_path, path, "onnxruntime", alternative_options={"model_file": str(user)})
    err = info.value
    assert err.code == "DF002" and f"could not load {user} (its checkpoint copy" in err.message
    assert "In llama-fp16.onnx, its Cast node(s) " in err.message and "detect_available_backends" not in err.hint
    block = [node for node in casts.values()]
    assert f"node_block_list={block!r}" in err.hint
    fixed = tmp_path / "llama-fp16-fixed.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True, node_block_list=block),
              str(fixed))
    assert float16_cast_conflicts(onnx.load(str(fixed))) == {}
    result = _validate(tmp_path, path, "onnxruntime", alternative_options={"model_file": str(fixed)}, isolate=False)
    assert result["verdict"] == "failed" and result["consistent_with"] == "float16"


@pytest.mark.slow
def test_a_transformer_optimizer_output_is_matched_by_tensor_names(bert_onnx, tmp_path):
    """onnxruntime's transformer optimizer output (fused attention and layer norms) as the
    alternative: every checkpoint found in it by name, isolation cuts its layers, and the node
    outputs the fusion removed are left out of the mark-all comparison, not failed."""
    from onnxruntime.transformers import optimizer

    fused = tmp_path / "bert-opt.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer.optimize_model(str(bert_onnx), model_type="bert", num_heads=2, hidden_size=32,
                                 opt_level=1).save_model_to_file(str(fused))
    result = _validate(tmp_path, bert_onnx, "onnxruntime", alternative_options={"model_file": str(fused)},
                       mark_all=True)
    assert result["verdict"] == "passed", result["failed"]
    assert len(result["results"]) == 6 and result["introducing_layers"] == []
    marked = result["mark_all"]
    assert marked["failed"] == 0 and marked["compared"] > 50 and marked["skipped"]["not in the alternative's file"] > 0


@pytest.mark.slow
def test_a_quantized_file_is_said_to_err_by_quantization_not_by_a_float_precision(bert_onnx, tmp_path):
    """An int8 file (onnxruntime's quantize_dynamic) fails at float32; whatever float precision the size
    of its error matches, the diagnosis names its quantized operators and the words say quantization."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from debug_framework.reports._common import precision_text

    q8 = tmp_path / "bert-int8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(bert_onnx), str(q8), weight_type=QuantType.QInt8)
    result = _validate(tmp_path, bert_onnx, "onnxruntime", alternative_options={"model_file": str(q8)})
    assert result["verdict"] == "failed"
    quantized = result["precision_diagnosis"]["quantized"]
    assert quantized.get("MatMulInteger", 0) > 0 and quantized.get("DynamicQuantizeLinear", 0) > 0
    if result["consistent_with"] is not None:
        text = precision_text(result["consistent_with"], "float32", quantized)
        assert "quantized (" in text and "comes from quantization" in text



_NO_TORCH = """
import json, sys
from debug_framework.cli.debug_validate import run
for n, extra in enumerate(([], ["--alternative-model", sys.argv[2], "--drill-down"])):
    run(["--model-path", sys.argv[1], "--alternative-backend", "onnxruntime", "--mark-all", "--output-file",
         f"r{n}.json", "--checkpoints", "post_embedding,post_mlp,post_processing", *extra])
print(json.dumps(sorted(m for m in ("torch", "transformers") if m in sys.modules)))
"""


@pytest.mark.slow
def test_an_onnx_file_validates_without_importing_torch(tmp_path):
    """A fresh process validates an ONNX file against onnxruntime, every node output marked, and an
    injected bug in the alternative file fails it and is drilled to its node: torch and
    transformers are never imported (the installed drill-down strategies' entry points included)."""
    import json
    import subprocess
    import sys

    model = _legacy_graph(tmp_path / "m.onnx")
    proto = onnx.load(str(model))
    next(n for n in proto.graph.node if n.name == "/model/layers.1/Add").op_type = "Sub"  # layer 1's bug
    onnx.save(proto, str(tmp_path / "bug.onnx"))
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, str(model), str(tmp_path / "bug.onnx")], cwd=tmp_path,
                          text=True, capture_output=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src), "HOME": str(tmp_path),
                               "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []  # neither torch nor transformers imported
    good, bad = (json.loads((tmp_path / f"r{n}.json").read_text()) for n in range(2))
    assert good["verdict"] == "passed" and good["mark_all"]["compared"] == 6 and good["mark_all"]["failed"] == 0
    assert bad["verdict"] == "failed" and bad["mark_all"]["failed"] > 0
    assert [r["passed"] for r in bad["results"]] == [True, True, False, False]  # from layer 1 on
    assert [(d["layer"], d["culprit"]["node"], d["culprit"]["op"]) for d in bad["drilldown"]] == [
        (1, "/model/layers.1/Add", "Sub")]
