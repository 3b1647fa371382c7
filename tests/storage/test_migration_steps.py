"""Schema 6 -> 7: the checkpoint rows gain ``step`` (the decode pass) in their unique key.

The version-6 database is made by the code of that version (``SCHEMA_VERSION`` held at 6) and its
rows written in the version-6 layout by hand: a session that does not decode, and a decode session
whose steps >= 1 were kept inside ``layer_key`` (the layer, or -1, plus step x 2^20). On both engines.
"""

from __future__ import annotations

import json

import pytest

from debug_framework.storage import schema
from debug_framework.storage.database import Database

_V6_ROW = ("INSERT INTO checkpoint_results (session_id, checkpoint, layer, layer_key, passed, max_abs_error,"
           " metrics_json, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
_DECODE = [("post_embedding", None), ("post_mlp", 0), ("post_mlp", 1), ("post_processing", None)]


def _v6_database(path, monkeypatch) -> None:
    """A version-6 database with a plain session and a decode session of 3 passes (steps 0, 1, 2)."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 6)
    db = Database(path)
    assert db.schema_version() == 6 and "step" not in db.dialect.columns(db.get_connection(), "checkpoint_results")
    for sid in ("plain", "decode"):
        db.sessions.create("/m", "python_reference", "pytorch", session_id=sid)
    n = 0
    for cp, layer in _DECODE:  # the plain session: step null in its results, layer_key the layer or -1
        n += 1
        db.execute_query(_V6_ROW, ("plain", cp, layer, -1 if layer is None else layer, 1, 1e-7,
                                   json.dumps({"checkpoint": cp, "layer": layer, "step": None, "passed": True}),
                                   f"t{n:03d}", f"t{n:03d}"))
    for step in range(3):
        for cp, layer in _DECODE:
            n += 1
            base = -1 if layer is None else layer
            doc = {"id": f"{cp}{'' if layer is None else f':{layer}'}@{step}", "checkpoint": cp, "layer": layer,
                   "step": step, "passed": step < 2, "max_abs_error": 0.5 * step}
            db.execute_query(_V6_ROW, ("decode", cp, layer, base + step * (1 << 20), int(step < 2), 0.5 * step,
                                       json.dumps(doc), f"t{n:03d}", f"t{n:03d}"))
    db.close()
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 7)


def test_a_version_6_database_migrates_every_decode_step_kept(any_db_path, monkeypatch):
    _v6_database(any_db_path, monkeypatch)
    db = Database(any_db_path)  # opening migrates
    assert db.schema_version() == 7
    plain = db.checkpoints.for_session("plain")
    assert [(r["id"], r["step"]) for r in plain] == [("post_embedding", None), ("post_mlp:0", None),
                                                     ("post_mlp:1", None), ("post_processing", None)]
    rows = db.checkpoints.for_session("decode")
    assert [(r["checkpoint"], r["layer"], r["step"]) for r in rows] == [
        (cp, layer, step) for step in range(3) for cp, layer in _DECODE]
    assert [r["passed"] for r in rows] == [True] * 8 + [False] * 4
    stored = db.execute_query("SELECT session_id, layer, layer_key, step FROM checkpoint_results ORDER BY id")
    assert all(r["layer_key"] == (-1 if r["layer"] is None else r["layer"]) for r in stored)  # the layer only
    assert [r["step"] for r in stored] == [0] * 4 + [s for s in range(3) for _ in _DECODE]
    # the migrated table takes new rows after the old ones (the id counter restarted past them) and
    # replaces a row by its full key: the same checkpoint at another step is a row of its own
    last = max(r["row_id"] for r in rows)
    db.checkpoints.add_many("decode", [{"checkpoint": "post_mlp", "layer": 1, "step": 3, "passed": True},
                                       {"checkpoint": "post_mlp", "layer": 1, "step": 2, "passed": True}])
    after = db.checkpoints.for_session("decode")
    assert len(after) == 13 and after[-1]["step"] == 3 and after[-1]["row_id"] > last
    assert [r["passed"] for r in after if (r["layer"], r["step"]) == (1, 2)] == [True]  # replaced in place
    db.close()


def test_a_step_that_is_not_a_pass_number_is_refused(tmp_path):
    from debug_framework.errors import ConfigurationError

    db = Database(tmp_path / "d.db")
    db.sessions.create("/m", "python_reference", "pytorch", session_id="s")
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ConfigurationError, match="step"):
            db.checkpoints.add_many("s", [{"checkpoint": "post_mlp", "layer": 0, "step": bad}])
    assert db.checkpoints.for_session("s") == []
    db.close()


def _v7_database(path, monkeypatch) -> None:
    """A version-7 database holding a session stored before the typed result: its row's judgement
    nested under ``judgement`` (rule under ``calibrated``, the replayed block's under
    ``introduced_judgement``), its isolation entry's MLP side under ``mlp_judgement``."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 7)
    db = Database(path)
    db.sessions.create("/m", "python_reference", "pytorch", session_id="old")
    mlp = {"input": "reference", "passed": False, "judged_by": "calibration", "bound": 0.01, "margin": 5.0,
           "reason": "beyond", "max_abs_error": 0.05, "rmse": 0.01}
    db.sessions.update("old", results={"verdict": "failed", "isolation": [
        {"layer": 1, "introduces_error": True, "block": "mlp", "blocks": ["mlp"], "mlp_judgement": mlp}]})
    doc = {"checkpoint": "post_mlp", "layer": 1, "passed": False, "max_abs_error": 0.5, "reason": "beyond its bound",
           "introduced_error": 0.05,
           "judgement": {"judged_by": "calibration", "bound": 0.1, "margin": 5.0,
                         "calibrated": {"metric": "rmse", "alternative_error": 0.2, "reference_error": 0.01,
                                        "multiplier": 8.0, "floor": 0.02},
                         "introduced_judgement": {"passed": False, "bound": 0.01, "margin": 5.0, "metric": "rmse",
                                                  "alternative_error": 0.05}}}
    db.execute_query(_V6_ROW.replace("layer_key,", "layer_key, step,").replace("?, ?)", "?, ?, ?)"),
                     ("old", "post_mlp", 1, 1, 0, 0, 0.5, json.dumps(doc), "t001", "t001"))
    db.close()
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 8)


def test_a_version_7_result_is_migrated_to_the_one_shape(any_db_path, monkeypatch):
    from debug_framework.services.validation.results import ValidationResult

    _v7_database(any_db_path, monkeypatch)
    db = Database(any_db_path)  # opening migrates
    assert db.schema_version() == 8
    (row,) = db.checkpoints.for_session("old")
    assert "judgement" not in row and row["judged_by"] == "calibration" and row["bound"] == 0.1
    assert row["rule"] == {"metric": "rmse", "error": 0.2, "baseline_error": 0.01, "multiplier": 8.0, "floor": 0.02}
    result = ValidationResult.load(db, "old")
    (cp,) = result.results
    assert (cp.id, cp.passed, cp.judged_by, cp.margin) == ("post_mlp:1", False, "calibration", 5.0)
    assert cp.judgement.rule is not None and cp.judgement.rule.bound == 8.0 * 0.01 + 0.02
    assert cp.introduces_error is True and cp.introduced is not None and cp.introduced.error.max_abs_error == 0.05
    (layer,) = result.isolation
    assert (layer.layer, layer.block, layer.verdict.mlp.margin) == (1, "mlp", 5.0)
    assert "mlp_judgement" not in db.sessions.get("old")["results"]["isolation"][0]
