"""The stage picks the strategy that can see inside the session's alternative: Inductor goes to the
minifier (an installed strategy, declared by debug_module in the entry-point group), ONNX Runtime to
the ONNX strategy, eager PyTorch to replay; and a session run through the engine with ONNX Runtime
and ``drill_down`` names the corrupted node."""

from __future__ import annotations

from pathlib import Path

import pytest

from debug_framework.backends import get_backend
from debug_framework.modelio.loader import load_model
from debug_framework.services.drilldown import choose_strategy
from debug_framework.services.validation_engine import ValidationEngine


@pytest.mark.parametrize("backend,strategy", [("inductor", "minifier"), ("pytorch", "replay"),
                                              pytest.param("onnxruntime", "onnx", marks=pytest.mark.slow)])  # exports
def test_each_backend_gets_the_strategy_that_sees_inside_it(tiny, backend, strategy):
    alternative = get_backend(backend)
    alternative.prepare(load_model(str(tiny("bert"))), "float32", "cpu")  # inductor compiles lazily: cheap
    chosen, why = choose_strategy(alternative)
    assert chosen is not None and chosen.name == strategy, why


@pytest.mark.slow
def test_a_session_on_onnxruntime_drills_to_the_corrupted_node(tiny, tmp_path):
    gelu_tanh = f"{Path(__file__).with_name('buggy_onnx.py')}:gelu_tanh"
    engine = ValidationEngine(tmp_path / "s.db")
    sid = engine.create_session(tiny("bert"), {"dtype": "float32", "drill_down": True,
                                               "alternative_options": {"graph_transform": gelu_tanh}},
                                "python_reference", "onnxruntime")
    result = engine.run(sid)
    assert result.verdict == "failed" and result.drilldown
    first = result.drilldown[0]
    assert first.method == "onnx" and first.culprit is not None, first.note
    assert first.culprit.op.startswith("Gelu") and "aten.gelu" in first.culprit.op
    assert first.culprit.module_path.endswith("intermediate.intermediate_act_fn") and first.culprit.verified
    stored = engine.get_session_results(sid)["results"]["drilldown"]
    assert stored[0]["culprit"]["node"] == first.culprit.node
