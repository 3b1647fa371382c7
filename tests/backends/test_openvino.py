"""``openvino``: OpenVINO on the Hugging Face model's ONNX export, its precision hint recorded, and
the precision diagnosis naming a bfloat16 run for what it is.

The bfloat16 rounding the backend applies where the device has no bfloat16 arithmetic is checked
against torch's conversion bit for bit (fast). The sessions (slow: one export, shared by every
session of the process) on a tiny BERT: with ``precision_hint="bf16"`` a float32 validation fails
at every checkpoint and is ``consistent_with: "bfloat16"``; the same backend passes at
``dtype="bfloat16"``; with ``"f32"`` it passes at float32. The session records the hint and the
precision OpenVINO reports.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

openvino = pytest.importorskip("openvino")

from debug_framework.backends import get_backend  # noqa: E402
from debug_framework.backends.openvino.runner import round_to_bfloat16  # noqa: E402
from debug_framework.errors import BackendInitializationError  # noqa: E402


def test_bf16_rounding_in_the_graph_is_torchs_and_leaves_mask_constants():
    import openvino.opset13 as ops

    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    x *= np.exp(3 * np.random.default_rng(1).standard_normal(x.shape)).astype(np.float32)
    x[0, :3] = [np.finfo(np.float32).min, -1e31, 0.0]
    p = ops.parameter(list(x.shape), openvino.Type.f32, name="x")
    model = openvino.Model([ops.relu(ops.negative(ops.negative(p)))], [p])  # computes x where x > 0
    assert round_to_bfloat16(model) >= 2
    got = openvino.Core().compile_model(model, "CPU")(np.abs(x))[0]
    want = torch.from_numpy(np.abs(x)).to(torch.bfloat16).to(torch.float32).numpy()
    big = np.abs(x) > 1e30
    assert np.array_equal(got[~big], want[~big])  # round-to-nearest-even, bit for bit
    assert np.array_equal(got[big], np.abs(x)[big])  # finfo.min-like constants kept, not inf


def test_an_unknown_hint_is_refused():
    with pytest.raises(BackendInitializationError, match="unknown precision hint 'f8'"):
        get_backend("openvino", precision_hint="f8")


@pytest.mark.slow
def test_a_bf16_run_is_consistent_with_bfloat16_and_passes_there(tiny_bert, tmp_path):
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(tmp_path / "debug.db")

    def session(hint, dtype):
        sid = engine.create_session(tiny_bert, {"dtype": dtype, "alternative_options": {"precision_hint": hint},
                                                "isolate": False}, "python_reference", "openvino")
        return engine.run(sid), engine.db.sessions.get(sid)

    failed, stored = session("bf16", "float32")
    info = _alternative_versions(stored)
    assert info["precision_hint"] == "bf16" and info["bf16_rounding"] in ("emulated", "native")
    assert failed.verdict == "failed" and failed.precision_diagnosis["measured"] == ["float16", "bfloat16"]
    if info["bf16_rounding"] == "emulated":  # every value rounded to bfloat16, as a correct bfloat16 run rounds
        assert failed.consistent_with == "bfloat16"
        assert all(r.judgement.consistent_with == "bfloat16" for r in failed.results if not r.passed)
        rows = failed.to_dict()["results"]
        assert {r["consistent_with"] for r in rows if not r["passed"]} == {"bfloat16"}
    else:  # native (AMX): accumulations, lookups and some operations kept in float32, a mixed precision
        # between float32 and a correct half-precision run: named where it is within 8x of one
        assert failed.consistent_with in (None, "float16", "bfloat16")
    assert info["runtime"] == "openvino"

    passed, _ = session("bf16", "bfloat16")
    assert passed.verdict == "passed" and passed.consistent_with is None
    exact, stored = session("f32", "float32")
    assert exact.verdict == "passed" and exact.consistent_with is None and exact.precision_diagnosis is None
    info = _alternative_versions(stored)
    assert info["precision_hint"] == "f32" and info["inference_precision"] == "f32" and info["bf16_rounding"] is None


SOFTMAX_BUG = """def transform(model):
    for node in model.graph.node:  # every softmax over the query axis instead of the key axis
        if node.op_type == "Softmax":
            for attribute in node.attribute:
                if attribute.name == "axis":
                    attribute.i = 2
    return model
"""


@pytest.mark.slow
def test_a_wrong_node_is_drilled_to_through_openvino(tiny_bert, tmp_path):
    """A graph transform that turns every Softmax to the wrong axis: the ``openvino`` drill-down
    replays each node of the layer alone in OpenVINO and names the Softmax in the attention."""
    from debug_framework.services.validation_engine import ValidationEngine

    (tmp_path / "softmax_bug.py").write_text(SOFTMAX_BUG, encoding="utf-8")
    engine = ValidationEngine(tmp_path / "debug.db")
    options = {"precision_hint": "f32", "graph_transform": f"{tmp_path / 'softmax_bug.py'}:transform"}
    result = engine.run(engine.create_session(tiny_bert, {"drill_down": True, "isolate": False,
                                                          "alternative_options": options},
                                              "python_reference", "openvino"))
    assert result.verdict == "failed" and result.consistent_with is None
    assert str(result.first_divergence.key) == "post_attention:0"
    (entry,) = result.drilldown
    assert entry.method == "openvino" and entry.culprit is not None, entry.note
    assert entry.culprit.op.startswith("Softmax") and entry.culprit.module_path == "encoder.layer.0.attention.self"
    assert "could not be replayed" not in entry.note and "no standalone repro" in entry.note


def _alternative_versions(session: dict) -> dict:
    """The alternative backend's version_info as the session recorded it after prepare."""
    return session["alternative_backend_info"]["versions"]


@pytest.mark.slow
def test_openvino_at_defaults_on_the_real_minilm_completes_with_isolation(minilm_path, tmp_path, capsys):
    """All-MiniLM-L6-v2 through OpenVINO at its defaults, as a user runs it: each layer replayed
    through the cut graph (whose inputs OpenVINO now types as ONNX Runtime does, ``tensor(float)``;
    it crashed in ``run_layer(0)``), a verdict and every layer's isolation."""
    import json

    from debug_framework.cli.debug_validate import run

    code = run(["--model-path", str(minilm_path), "--alternative-backend", "openvino", "--json",
                "--database", str(tmp_path / "ov.db")])
    out = capsys.readouterr().out
    assert code in (0, 1), out[-2000:]
    doc = json.loads(out)
    assert doc["verdict"] in ("passed", "failed")
    assert [layer["layer"] for layer in doc["isolation"]] == list(range(6))
    assert all(layer["layer_replay"] is not None for layer in doc["isolation"])
