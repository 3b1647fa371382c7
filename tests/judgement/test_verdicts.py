"""The judgement's contracts: oracle mode with the reference as the oracle, explicit tolerances win
where given, a misconfigured calibration is refused up front, every failure names its source, and
the verdict shows its bound (rows, JSON, CLI, HTML report)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from debug_framework.backends import module_backend, register_backend, unregister_backend
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.capture import CheckpointKey
from debug_framework.comparison import compare
from debug_framework.errors import ValidationError
from debug_framework.services.validation.results import CheckpointOutcome, LayerIsolation, error_source

from benchmarks.injected_bugs import BUG_LAYER, register_bug_backend


@pytest.fixture
def patched_backend():
    """``make(name, patch)``: eager transformers with ``patch(net)`` applied, registered for the test."""
    names: list[str] = []

    def make(name, patch):
        def build(model, dtype, device):
            net = build_hf_model(model, dtype, device)
            patch(net)
            return net

        register_backend(name, module_backend(name, build), replace=True)
        names.append(name)
        return name

    yield make
    for n in names:
        unregister_backend(n)


def test_readme_oracle_example_passes_a_correct_backend(tiny_models, engine):
    """--dtype bfloat16 --oracle with the default reference (python_reference float64 = the oracle):
    judged against the trusted bfloat16 run, not against an error of 0 plus an absolute floor."""
    model = tiny_models("llama", 0)
    result = engine.run(engine.create_session(model, {"dtype": "bfloat16", "oracle": True}, "python_reference",
                                              "pytorch"))
    assert result.reference_dtype == "float64" and result.passed, result.first_divergence
    assert result.oracle["baseline"] == "a correct bfloat16 run" and "RMS" in result.oracle["floor"]
    for o in result.results[1:]:
        assert o.oracle.reference_error > 0 and o.oracle.floor > 0 and o.margin <= 1


def test_oracle_mode_locates_a_bug(tiny_models, engine):
    backend = register_bug_backend("kv_head_mapping")
    try:
        result = engine.run(engine.create_session(tiny_models("qwen2", 0), {"dtype": "bfloat16", "oracle": True},
                                                  "python_reference", backend))
    finally:
        unregister_backend(backend)
    assert str(result.first_divergence.key) == f"post_attention:{BUG_LAYER}"
    assert result.introducing_layers == [BUG_LAYER] and result.error_source["kind"] == "layer"


def test_explicit_tolerance_wins_where_given(tiny_models, engine):
    cfg = {"precision_thresholds": {"post_mlp:1": {"rtol": 0.0, "atol": 0.0}}, "isolate": False}
    result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "python_reference", "pytorch"))
    by_key = {str(o.key): o for o in result.results}
    assert by_key["post_mlp:1"].judged_by == "tolerance" and not by_key["post_mlp:1"].passed
    assert by_key["post_mlp:1"].margin > 1  # max |a - r| / (atol + rtol |r|) with a zero tolerance: infinite
    assert all(o.judged_by == "calibration" and o.passed for k, o in by_key.items() if k != "post_mlp:1")
    fixed = engine.run(engine.create_session(tiny_models("llama", 0), {"precision_thresholds": {"rtol": 1e-4,
                       "atol": 1e-4}, "isolate": False}, "python_reference", "pytorch"))
    assert all(o.judged_by == "tolerance" and o.noise is None for o in fixed.results)  # global fields: all of them
    assert "calibration" not in fixed.performance  # nothing to calibrate: the extra run is skipped


def test_calibration_that_cannot_run_is_refused_up_front(tiny_models, engine):
    model = tiny_models("llama", 0)
    with pytest.raises(ValidationError, match="is the alternative itself") as info:
        engine.create_session(model, {"calibration_backend": "pytorch"}, "python_reference", "pytorch")
    assert info.value.code == "DF005" and "calibration_backend 'auto'" in info.value.hint
    with pytest.raises(ValidationError, match="cannot run the alternative's dtype 'bfloat16'"):
        engine.create_session(model, {"calibration_backend": "python_reference", "dtype": "bfloat16"},
                              "pytorch", "pytorch")
    for bad in ({"noise_margin": -1}, {"floor_eps": "x"}, {"calibrate": "yes"}, {"calibration_metric": "l7"}):
        with pytest.raises(ValidationError):
            engine.create_session(model, bad, "python_reference", "pytorch")
    assert engine.db.sessions.list() == []


def test_embedding_and_head_bugs_name_their_source(tiny_models, engine, patched_backend):
    import torch

    def scale_embedding(net):
        with torch.no_grad():
            net.model.embed_tokens.weight.mul_(1.001)

    def drop_final_norm(net):
        with torch.no_grad():
            net.model.norm.weight.fill_(1.0)

    model = tiny_models("llama", 0)
    emb = engine.run(engine.create_session(model, {}, "python_reference", patched_backend("emb_bug", scale_embedding)))
    assert str(emb.first_divergence.key) == "post_embedding" and emb.error_source["kind"] == "embedding"
    head = engine.run(engine.create_session(model, {}, "python_reference", patched_backend("head_bug", drop_final_norm)))
    assert str(head.first_divergence.key) == "post_processing" and head.introducing_layers == []
    assert head.error_source["kind"] == "head" and head.error_source["confirmed"]


def _outcome(key, passed):
    comp = compare(np.ones(2), np.ones(2))
    return CheckpointOutcome(key=CheckpointKey.parse(key), comparison=comp, passed=passed, reason=None)


def test_accumulation_is_named_when_no_layer_introduces():
    """The attribution rule itself: a per-layer failure with every replay within its bound is accumulation;
    without isolation the layer where it shows is named, unconfirmed."""
    ok = compare(np.ones(2), np.ones(2))
    results = [_outcome("post_embedding", True), _outcome("post_attention:0", True), _outcome("post_mlp:0", True),
               _outcome("post_attention:1", False), _outcome("post_mlp:1", False), _outcome("post_processing", False)]
    isolation = [LayerIsolation(layer=i, carried_in=ok, introduced_attention=ok, introduced_mlp=ok, total=ok)
                 for i in range(2)]
    source = error_source(results, isolation)
    assert source["kind"] == "accumulation" and source["layer"] == 1 and source["block"] == "attention"
    unconfirmed = error_source(results, None, "the alternative cannot run a single layer")
    assert unconfirmed["kind"] == "layer" and unconfirmed["layer"] == 1 and not unconfirmed["confirmed"]
    assert "cannot run a single layer" in unconfirmed["detail"]
    assert error_source(results[:3], isolation) is None


def test_the_bound_is_shown_everywhere(tiny_models, engine, tmp_path):
    from debug_framework.cli.debug_validate import run
    from debug_framework.models.validation_report import ValidationReport

    backend = register_bug_backend("rope_convention")
    try:
        db = tmp_path / "cli.db"
        out = tmp_path / "result.json"
        code = run(["--model-path", str(tiny_models("llama", 0)), "--alternative-backend", backend,
                    "--database", str(db), "--output-file", str(out)])
    finally:
        unregister_backend(backend)
    assert code == 1
    doc = json.loads(out.read_text())
    assert doc["error_source"]["kind"] == "layer" and doc["error_source"]["layer"] == BUG_LAYER
    assert doc["first_divergence"]["margin"] > 1 and doc["first_divergence"]["judged_by"] == "calibration"
    for r in doc["results"]:
        assert r["bound"] > 0 and r["margin"] is not None and r["judged_by"] == "calibration"
    for layer in doc["isolation"]:
        assert {"carried_in_rmse", "carried_out_rmse", "growth", "calibration_growth"} <= set(layer)
        assert layer["mlp_judgement"]["bound"] > 0
    rows = {(r["checkpoint"], r["layer"]): r for r in doc["results"]}
    assert rows[("post_mlp", BUG_LAYER)]["accumulation"] == {k: doc["isolation"][BUG_LAYER][k] for k in
                                                            rows[("post_mlp", BUG_LAYER)]["accumulation"]}
    grown = doc["isolation"][BUG_LAYER + 1]
    assert grown["carried_in_rmse"] > 100 * grown["calibration_in_rmse"]  # carried in from the buggy layer
    assert not math.isnan(grown["growth"]) and grown["growth"] < 10  # ... and only propagated

    from debug_framework.services.database_manager import DatabaseManager

    page = ValidationReport.from_session(doc["session_id"], DatabaseManager(db)).generate_html_report()
    assert "margin (error / bound)" in page and 'id="error-source"' in page
    import re

    charts = dict(re.findall(r'data-chart="([a-z_0-9]+)"(.*?)</svg>', page, flags=re.S))
    for name, svg in charts.items():
        if name != "per_layer_time":  # every error chart draws its bound
            assert "bound at" in svg, name


def test_isolation_never_overrides_a_calibrated_verdict_with_a_fixed_tolerance():
    """Without a calibrated replay verdict (a calibration backend that cannot replay a layer), the
    replay's fixed tolerance fails only checkpoints that are themselves judged by a tolerance."""
    import torch

    from debug_framework.capture.keys import CheckpointKey
    from debug_framework.comparison import RatioRule, compare
    from debug_framework.services.validation.results import CheckpointOutcome

    ref = torch.ones(8)
    off = compare(ref, ref + 1e-2)  # fails the float32 tolerance
    key = CheckpointKey("post_attention", 1)
    calibrated = RatioRule.calibrated(ref, 1e-7).verdict(off, off)  # within its calibrated bound
    by_noise = CheckpointOutcome(key, off, True, None, introduced=off, judgement=calibrated)
    assert by_noise.introduces_error and not by_noise.fails_by_isolation
    by_tolerance = CheckpointOutcome(key, off, True, None, introduced=off)
    assert by_tolerance.fails_by_isolation
    replay_fails = RatioRule.calibrated(ref, 1e-7).verdict(compare(ref, ref), off)
    by_replay = CheckpointOutcome(key, off, True, None, introduced=off, judgement=calibrated,
                                  introduced_judgement=replay_fails)
    assert by_replay.fails_by_isolation
