from __future__ import annotations

import json
import math

import pytest

from debug_framework.errors import DatabaseError, ValidationError
from debug_framework.models.debug_session import DebugSession, capture_environment
from debug_framework.models.tensor_comparison import TensorComparison
from debug_framework.models.validation_checkpoint import ValidationCheckpoint
from debug_framework.models.validation_report import ValidationReport


def _session(db, **kw):
    base = dict(model_path="/models/tiny", reference_backend="python_reference", alternative_backend="pytorch",
                config={"enabled_checkpoints": ["post_mlp"], "precision_thresholds": {"rtol": 1e-4}}, db=db)
    base.update(kw)
    return DebugSession(**base)


def test_debug_session_save_load_update(db, db_path, make_result):
    env = capture_environment("cpu")
    assert env["device"] == "cpu" and env["python"] and env["torch"]
    s = _session(db, seed=5, environment=env, tolerances={"rtol": 1e-4, "atol": 1e-6},
                 reference_backend_info={"version": "0.1"}, alternative_backend_info={"torch": env["torch"]})
    assert s.save() is True and s.status == "created" and s.updated_at is not None
    s.update_status("running")
    assert s.status == "running" and s.started_at is not None
    s.add_checkpoint_result("post_mlp", make_result("post_mlp", 0, 1e-7, True))
    s.add_checkpoint_result("post_mlp", make_result("ignored", 1, 0.3, False), layer=1)
    s.results = {"verdict": "failed"}
    s.save()
    s.update_status("failed", "post_mlp:1 over tolerance")
    loaded = DebugSession.load(s.session_id, db=str(db_path))  # a path works as well as a manager
    assert loaded == s
    assert loaded.to_dict() == s.to_dict() and DebugSession.from_dict(s.to_dict()) == s
    assert [(r["checkpoint"], r["layer"], r["passed"]) for r in loaded.checkpoint_results()] == [
        ("post_mlp", 0, True), ("post_mlp", 1, False)]
    assert DebugSession.load("nope", db=db) is None
    loaded.db.close()


def test_debug_session_refuses_bad_transitions_and_missing_db(db):
    s = _session(db)
    s.save()
    with pytest.raises(ValidationError):
        s.update_status("passed")
    assert DebugSession.load(s.session_id, db=db).status == "created"
    s.status = "passed"  # save() applies a status change by the same rules, atomically with the rest
    s.results = {"verdict": "passed"}
    with pytest.raises(ValidationError):
        s.save()
    assert DebugSession.load(s.session_id, db=db).results is None
    with pytest.raises(DatabaseError, match="no database"):
        DebugSession(model_path="m", reference_backend="a", alternative_backend="b").save()


def test_validation_checkpoint_and_tensor_comparison(db, make_result):
    s = _session(db)
    s.save()
    import torch

    cp = ValidationCheckpoint(session_id=s.session_id, checkpoint_name="post_attention", layer=2,
                              comparison_result=make_result("post_attention", 2, 0.01, False),
                              reference_tensor=torch.zeros(2, 3), alternative_tensor=torch.ones(2, 3))
    assert cp.to_dict()["reference_tensor"] == {"shape": [2, 3], "dtype": "torch.float32"}
    cp.save(db)
    (back,) = ValidationCheckpoint.for_session(s.session_id, db)
    assert back.checkpoint_id == cp.checkpoint_id and back.passed is False
    assert back.comparison_result["max_abs_error"] == 0.01 and back.layer == 2
    tc = TensorComparison.from_comparison_result(s.session_id, make_result("post_attention", 2, 0.01, False))
    tc.save(db)
    (tcb,) = TensorComparison.for_session(s.session_id, db)
    assert tcb == tc and tcb.match_status is False and tcb.tolerance_config == {"rtol": 1e-4, "atol": 1e-6}


def test_validation_report_json_and_escaped_html(db, tmp_path, make_result):
    evil = "<script>alert('x')</script>"
    s = _session(db, model_path=f"/m/{evil}", environment={"device": evil})
    s.save()
    s.update_status("running")
    s.add_checkpoint_result("post_embedding", make_result("post_embedding", None, 1e-8, True))
    s.add_checkpoint_result("post_mlp", make_result("post_mlp", 0, 1e-7, True))
    s.add_checkpoint_result(evil, make_result(evil, 1, 0.2, False, max_abs_error=0.2))
    s.add_checkpoint_result("post_mlp", make_result("post_mlp", 2, math.nan, False))
    s.results = {"performance": {"reference_s": 1.5, "alternative_s": 0.25}}
    s.save()
    s.update_status("failed")
    rep = ValidationReport.from_session(s.session_id, db)
    st = rep.summary_statistics
    assert (rep.overall_status, st["checkpoints"], st["passed"], st["failed"]) == ("failed", 4, 2, 2)
    assert st["first_divergence"]["checkpoint"] == evil and st["first_divergence"]["layer"] == 1
    assert (st["worst"]["checkpoint"], st["worst"]["layer"]) == ("post_mlp", 2)  # NaN counts as worst
    assert rep.performance_metrics == {"reference_s": 1.5, "alternative_s": 0.25}

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    data = json.loads(rep.export_to_json(), parse_constant=no_constants)
    assert data["checkpoint_results"][3]["max_abs_error"] == "NaN" and data["session"]["model_path"].endswith(evil)
    page = rep.generate_html_report()
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert 'class="first"' in page and page.count("first divergence") >= 2
    assert rep.save_to_file(tmp_path / "out" / "r.json") and json.loads((tmp_path / "out" / "r.json").read_text())
    assert rep.save_to_file(tmp_path / "r.html", format="html")
    written = (tmp_path / "r.html").read_text()
    assert written.startswith("<!DOCTYPE html>") and "<script>" not in written and "&lt;script&gt;" in written
    with pytest.raises(ValidationError):
        rep.save_to_file(tmp_path / "r.xml", format="xml")
    with pytest.raises(DatabaseError):
        ValidationReport.from_session("ghost", db)
