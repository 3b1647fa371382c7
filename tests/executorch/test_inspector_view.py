"""ExecuTorch's Inspector beside our judgement, fast (no export): an operator placed by its module
path, per-place worst gaps, and a failure said plainly in the terminal, ``--json`` and the HTML
section (the real Inspector's run: test_executorch.py)."""

from __future__ import annotations

from debug_framework.backends.executorch.inspector import InspectorEvidence, place_of
from debug_framework.reports._inspector import inspector_section, inspector_text, inspector_view
from debug_framework.services.validation.results import CheckpointResult, ValidationResult


def test_an_operator_is_placed_by_its_module_path():
    assert place_of("net.model.layers.12.mlp.down_proj", after_layers=False) == "layer 12"
    assert place_of("bert.encoder.layer.3.attention", after_layers=False) == "layer 3"
    assert place_of("net.model.embed_tokens", after_layers=False) == "embedding"
    assert place_of("net.model.norm", after_layers=True) == "head"
    assert place_of("net.model.layers_norm", after_layers=True) == "head"  # not a layer index


def _evidence() -> InspectorEvidence:
    ops = [{"operator": "embedding", "module": "net.model.embed_tokens", "place": "embedding", "gap": 0.0},
           {"operator": "linear_1", "module": "net.model.layers.0.mlp", "place": "layer 0", "gap": 2e-12},
           {"operator": "rsqrt_1", "module": "net.model.layers.0.input_layernorm", "place": "layer 0", "gap": 5e-11},
           {"operator": "linear_9", "module": "net.lm_head", "place": "head", "gap": 1e-12}]
    return InspectorEvidence(True, 0.5, "MSE", "the session's 2 rows one by one at batch 1", ops,
                             notes=["at the session's batch of 2: ValueError: size"])


def _result(inspector: dict | None) -> ValidationResult:
    rows = [CheckpointResult.from_row({"checkpoint": c, "layer": layer, "passed": True})
            for c, layer in (("post_embedding", None), ("post_mlp", 0), ("post_processing", None))]
    return ValidationResult("s1", "m", "float64_eager", "executorch", "float64", "float32", rows, inspector=inspector)


def test_per_place_the_worst_gap_beside_our_verdict():
    record = _evidence().to_dict()
    assert [(p["place"], p["operators"], p["gap"], p["operator"]) for p in record["places"]] == [
        ("embedding", 1, 0.0, "embedding"), ("layer 0", 2, 5e-11, "rsqrt_1"), ("head", 1, 1e-12, "linear_9")]
    view = inspector_view(_result(record))
    assert [(r.place, r.passed, r.gap) for r in view] == [("embedding", True, 0.0), ("layer 0", True, 5e-11),
                                                          ("head", True, 1e-12)]


def test_a_failed_inspector_is_said_plainly_everywhere():
    failed = InspectorEvidence(False, 1.25, "MSE", "the session's 2 rows one by one at batch 1",
                               why="RuntimeError: <XNNPACK> delegate", notes=["at the session's batch of 2: ValueError"])
    result = _result(failed.to_dict())
    assert inspector_view(result) == []
    assert result.to_dict()["inspector"]["why"] == "RuntimeError: <XNNPACK> delegate"
    lines = inspector_text(result)
    assert lines == ["inspector: ExecuTorch's Inspector failed after 1.25 s (the session's 2 rows one by one at "
                     "batch 1): RuntimeError: <XNNPACK> delegate", "inspector: at the session's batch of 2: ValueError"]
    page = inspector_section(result)
    assert "failed after 1.25 s" in page and "&lt;XNNPACK&gt;" in page and "<table>" not in page
    assert inspector_section(_result(None)) == "" and inspector_text(_result(None)) == []


def test_a_failure_names_the_known_causes_the_session_has():
    """XNNPACK's delegate and grouped-query attention: what the Inspector is known to fail on."""
    from types import SimpleNamespace

    from debug_framework.backends.executorch.runner import ExecuTorchBackend

    gqa = SimpleNamespace(config=SimpleNamespace(num_attention_heads=4, num_key_value_heads=2))
    causes = ExecuTorchBackend(delegate="xnnpack")._known_causes(gqa)
    assert len(causes) == 2 and "XNNPACK's delegate" in causes[0] and "grouped-query attention (4 query heads, 2" in causes[1]
    plain = SimpleNamespace(config=SimpleNamespace(num_attention_heads=4, num_key_value_heads=4))
    assert ExecuTorchBackend(delegate="portable")._known_causes(plain) == []
