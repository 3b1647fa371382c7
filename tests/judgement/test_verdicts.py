"""The judgement's contracts: oracle mode with the reference as the oracle, explicit tolerances win
where given, a misconfigured calibration is refused up front, every failure names its source, and
the verdict shows its bound (rows, JSON, CLI, HTML report)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from debug_framework.backends import unregister_backend
from debug_framework.capture import CheckpointKey
from debug_framework.comparison import compare
from debug_framework.errors import ValidationError
from debug_framework.services.validation.judge import Judgement, LayerVerdict, error_source

from benchmarks.injected_bugs import BUG_LAYER, register_bug_backend


def test_readme_oracle_example_passes_a_correct_backend(tiny_models, engine):
    """--dtype bfloat16 --oracle with the default reference (python_reference float64 = the oracle):
    judged against the trusted bfloat16 run, not against an error of 0 plus an absolute floor."""
    model = tiny_models("llama", 0)
    result = engine.run(engine.create_session(model, {"dtype": "bfloat16", "oracle": True}, "python_reference",
                                              "pytorch"))
    assert result.reference_dtype == "float64" and result.passed, result.first_divergence
    assert result.oracle["baseline"] == "a correct bfloat16 run" and "RMS" in result.oracle["floor"]
    for o in result.results[1:]:
        assert o.judgement.rule.reference_error > 0 and o.judgement.rule.floor > 0 and o.margin <= 1


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


def _layer(i, attention=True, mlp=True, whole=True):
    def j(ok):
        return Judgement(ok, "calibration", 1.0, 0.5 if ok else 2.0)

    return LayerVerdict(i, j(attention), j(mlp), j(whole), "reference")


def test_accumulation_is_named_when_no_layer_introduces():
    """The attribution rule itself: a per-layer failure with every replay within its bound is accumulation;
    without isolation the layer where it shows is named, unconfirmed."""
    first = CheckpointKey.parse("post_attention:1")
    layers = {i: _layer(i) for i in range(2)}
    source = error_source(first, layers)
    assert source["kind"] == "accumulation" and source["layer"] == 1 and source["block"] == "attention"
    unconfirmed = error_source(first, None, "the alternative cannot run a single layer")
    assert unconfirmed["kind"] == "layer" and unconfirmed["layer"] == 1 and not unconfirmed["confirmed"]
    assert "cannot run a single layer" in unconfirmed["detail"]
    assert error_source(None, layers) is None


def test_each_block_is_named_apart():
    """A layer's blocks are judged apart: the attention alone, the MLP alone, or neither alone but the
    whole layer (the wiring between them); a post_mlp checkpoint is marked only by what ends there."""
    att = _layer(0, attention=False)
    assert att.blocks == ["attention"] and att.introduces_at(CheckpointKey("post_mlp", 0)) is False
    mlp = _layer(0, mlp=False, whole=False)
    assert mlp.blocks == ["mlp"] and mlp.introduces_at(CheckpointKey("post_attention", 0)) is False
    glue = _layer(0, whole=False)
    assert glue.blocks == ["layer"] and glue.introduces_at(CheckpointKey("post_mlp", 0)) is True
    assert error_source(CheckpointKey("post_mlp", 0), {0: glue})["block"] == "layer"


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
    assert doc["first_divergence"]["margin"] > 1 and doc["first_divergence"]["judged_by"] in ("calibration", "isolation")
    for r in doc["results"]:
        assert r["bound"] > 0 and r["margin"] is not None and r["judged_by"] in ("calibration", "isolation")
        # a row names only the rule that judged it: no allclose verdict or tolerance beside it
        assert r["tolerance"] is None and "atol" not in (r["reason"] or "") and "passed" in r
    for layer in doc["isolation"]:
        assert {"carried_in_rmse", "carried_out_rmse", "growth", "calibration_growth"} <= set(layer)
        assert layer["mlp"]["bound"] > 0 and layer["mlp"]["input"] == "reference"
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
    from debug_framework.services.validation.judge import _with_isolation

    key = CheckpointKey("post_attention", 1)
    by_tolerance_replay = LayerVerdict(1, Judgement(False, "tolerance", reason="outside atol"), None,
                                       Judgement(True, "tolerance"), None)
    calibrated = Judgement(True, "calibration", 1.0, 0.5)
    assert _with_isolation(calibrated, by_tolerance_replay, key) is calibrated
    tolerance = Judgement(True, "tolerance")
    assert _with_isolation(tolerance, by_tolerance_replay, key).judged_by == "isolation"
    calibrated_replay = LayerVerdict(1, Judgement(False, "calibration", 1.0, 3.0, "calibrated bound: ..."), None,
                                     Judgement(True, "calibration", 1.0, 0.1), None)
    fails = _with_isolation(calibrated, calibrated_replay, key)
    assert not fails.passed and fails.judged_by == "isolation" and fails.margin == 3.0
