from __future__ import annotations

import math
import sqlite3
import threading
import time

import pytest

from debug_framework.errors import DatabaseError, ValidationError
from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager

EVIL = "models/it's \"quoted\"'); DROP TABLE sessions; --"


def test_fresh_database_is_current_wal_and_enforces_foreign_keys(db, db_path):
    assert db.schema_version() == SCHEMA_VERSION == 8
    assert db.execute_query("PRAGMA journal_mode")[0]["journal_mode"] == "wal"
    seen = {}

    def other_thread():  # a second thread gets its own, equally configured connection
        conn = db.get_connection()
        seen["fk"] = conn.execute("PRAGMA foreign_keys").fetchone()[0]
        seen["same"] = conn is main_conn

    main_conn = db.get_connection()
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == {"fk": 1, "same": False}
    tables = {r["name"] for r in db.execute_query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "sessions", "checkpoint_results", "tensor_recordings", "tensor_comparisons",
            "batch_jobs", "batch_job_items"} <= tables
    assert db.create_tables() is True and db.migrate_schema() is True  # idempotent
    assert db.execute_query("SELECT COUNT(*) AS n FROM schema_version WHERE version = 2")[0]["n"] == 1


def test_hostile_strings_are_stored_verbatim_by_parameterised_sql(db, make_result):
    sid = db.create_session(EVIL, "python_reference", "py'torch", config={"note": EVIL},
                            weights_digest="'; DELETE FROM sessions; --", seed=7)
    db.add_checkpoint_result(sid, make_result("post_mlp'); DROP TABLE checkpoint_results; --", 1, 0.5, False))
    row = db.get_session(sid)
    assert row["model_path"] == EVIL and row["config"] == {"note": EVIL}
    assert row["alternative_backend"] == "py'torch" and row["seed"] == 7
    assert [s["session_id"] for s in db.list_sessions(model_path=EVIL)] == [sid]
    assert db.get_checkpoint_results(sid)[0]["checkpoint"].startswith("post_mlp'); DROP")
    assert db.execute_query("SELECT COUNT(*) AS n FROM sessions")[0]["n"] == 1


def test_checkpoint_result_round_trips_losslessly_and_is_queryable(db, make_result):
    sid = db.create_session("m", "a", "b")
    res = make_result("post_attention", 3, 2.5, False, max_abs_error=float("nan"), sqnr_db=float("-inf"), nan_count_alt=5,
                      first_nonfinite_index=[0, 7], custom_metric={"k": 1})
    db.add_checkpoint_result(sid, res, introduced_error=0.25, propagated_error=0.75)
    (back,) = db.get_checkpoint_results(sid)
    assert math.isnan(back["max_abs_error"]) and back["sqnr_db"] == float("-inf")
    for key, value in res.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(back[key]), key
        else:
            assert back[key] == value, key
    assert back["introduced_error"] == 0.25 and back["propagated_error"] == 0.75
    cols = db.execute_query(
        "SELECT max_abs_error, mean_abs_error, nan_count_alt, passed, mismatch_count, extra, tolerance"
        " FROM checkpoint_results WHERE session_id = ?", (sid,))[0]
    assert cols["max_abs_error"] is None  # NaN cannot live in a REAL column; metrics_json keeps it
    assert cols["nan_count_alt"] == 5 and cols["passed"] == 0 and cols["mismatch_count"] == 17
    assert '"custom_metric"' in cols["extra"] and '"rtol"' in cols["tolerance"]


def test_result_dict_with_missing_metrics_is_accepted(db):
    sid = db.create_session("m", "a", "b")
    db.add_checkpoint_result(sid, {"checkpoint": "post_processing", "layer": None, "passed": True})
    (back,) = db.get_checkpoint_results(sid)
    assert back["passed"] is True and back["layer"] is None and back.get("max_abs_error") is None


def test_same_key_is_replaced_and_none_layer_differs_from_layer_zero(db, make_result):
    sid = db.create_session("m", "a", "b")
    db.add_checkpoint_results(sid, [make_result("post_embedding", None, 0.1, True),
                                    make_result("post_mlp", 0, 0.2, True),
                                    make_result("post_mlp", 1, 0.3, True)])
    db.add_checkpoint_result(sid, make_result("post_mlp", 0, 9.0, False))
    rows = db.get_checkpoint_results(sid)
    assert [(r["checkpoint"], r["layer"], r["max_abs_error"]) for r in rows] == [
        ("post_embedding", None, 0.1), ("post_mlp", 0, 9.0), ("post_mlp", 1, 0.3)]


def test_status_transitions_are_enforced_atomically(db):
    sid = db.create_session("m", "a", "b")
    row = db.get_session(sid)
    assert row["status"] == "created" and row["started_at"] is None and row["finished_at"] is None
    with pytest.raises(ValidationError, match="cannot go from 'created' to 'passed'"):
        db.update_session_status(sid, "passed")
    assert db.update_session_status(sid, "running") == "created"
    assert db.get_session(sid)["started_at"] is not None
    db.update_session_status(sid, "failed", error_message="post_mlp:3 over tolerance")
    row = db.get_session(sid)
    assert row["status"] == "failed" and row["finished_at"] is not None
    assert row["error_message"] == "post_mlp:3 over tolerance"
    for nxt in ("running", "passed", "error", "created"):
        with pytest.raises(ValidationError) as info:
            db.update_session_status(sid, nxt)
        assert info.value.code == "DF005"
    with pytest.raises(ValidationError, match="unknown session status"):
        db.update_session_status(sid, "done")
    assert db.get_session(sid)["status"] == "failed"
    with pytest.raises(DatabaseError, match="does not exist"):
        db.update_session_status("nope", "running")


def test_failed_writes_lose_nothing_already_recorded(db, make_result):
    sid = db.create_session("m", "a", "b")
    db.add_checkpoint_result(sid, make_result("post_mlp", 0, 0.1, True))
    with pytest.raises(ValidationError, match="no checkpoint name"):
        db.add_checkpoint_results(sid, [make_result("post_mlp", 1, 0.2, True), {"passed": True}])
    with pytest.raises(DatabaseError, match="does not exist") as info:
        db.add_checkpoint_result("missing-session", make_result("post_mlp", 0, 0.1, True))
    assert info.value.code == "DF003" and "What to do" in str(info.value)
    with pytest.raises(RuntimeError):
        with db.transaction():
            db.add_checkpoint_result(sid, make_result("post_mlp", 2, 0.3, True))
            raise RuntimeError("engine crashed mid-transaction")
    assert [r["layer"] for r in db.get_checkpoint_results(sid)] == [0]


def test_busy_database_is_waited_for_not_reported(db_path, make_result):
    db = DatabaseManager(db_path, busy_timeout_s=0.05, max_retry_s=30)
    sid = db.create_session("m", "a", "b")
    blocker = sqlite3.connect(str(db_path), isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock for a while
    threading.Timer(0.6, lambda: blocker.execute("COMMIT")).start()
    t0 = time.monotonic()
    db.add_checkpoint_result(sid, make_result("post_mlp", 0, 0.1, True))
    assert time.monotonic() - t0 >= 0.5
    assert len(db.get_checkpoint_results(sid)) == 1
    blocker.close()
    db.close()


def test_lock_held_beyond_retry_budget_gives_clear_database_error(db_path):
    db = DatabaseManager(db_path, busy_timeout_s=0.05, max_retry_s=0.3)
    sid = db.create_session("m", "a", "b")
    blocker = sqlite3.connect(str(db_path), isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DatabaseError) as info:
            db.update_session_status(sid, "running")
        assert info.value.code == "DF003" and "stayed locked" in info.value.message
        assert str(db_path.resolve()) in str(info.value)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert db.get_session(sid)["status"] == "created"
    db.update_session_status(sid, "running")  # works once the lock is gone
    db.close()


def test_execute_query_reads_and_writes(db):
    sid = db.create_session("m", "a", "b")
    assert db.execute_query("UPDATE sessions SET inputs_ref = ? WHERE session_id = ?", ("inputs/abc", sid)) == 1
    assert db.execute_query("SELECT inputs_ref FROM sessions WHERE session_id = ?", (sid,)) == [{"inputs_ref": "inputs/abc"}]
    with pytest.raises(DatabaseError, match="no such table"):
        db.execute_query("SELECT * FROM no_such_table")


def test_refuses_memory_and_package_paths(tmp_path):
    import debug_framework

    with pytest.raises(DatabaseError):
        DatabaseManager(":memory:")
    pkg = __import__("pathlib").Path(debug_framework.__file__).parent
    with pytest.raises(DatabaseError, match="inside the installed package"):
        DatabaseManager(pkg / "x.db")


def test_newer_schema_is_refused_not_damaged(db_path, db):
    db.execute_query("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (99, "future"))
    db.close()
    with pytest.raises(DatabaseError, match="newer than this code"):
        DatabaseManager(db_path)


def test_batch_job_items_resume(db):
    job = db.create_batch_job(["m1", "m2", "m3"], {"parallel_execution": True}, job_id="job-1")
    assert db.create_batch_job(["ignored"], job_id="job-1") == "job-1"  # re-run: same job, no new items
    first = db.claim_batch_item(job)
    assert first["model_path"] == "m1"
    sid = db.create_session("m1", "a", "b")
    db.update_batch_item(job, first["item_index"], status="done", session_id=sid)
    second = db.claim_batch_item(job)
    assert second["model_path"] == "m2"  # "killed" here: m2 stays running, m3 pending
    info = db.get_batch_job(job)
    assert [i["status"] for i in info["items"]] == ["done", "running", "pending"]
    assert info["items"][0]["session_id"] == sid and info["config"] == {"parallel_execution": True}
    with pytest.raises(ValidationError):
        db.update_batch_item(job, 1, status="weird")


@pytest.mark.parametrize("call", [
    lambda db, path: DatabaseManager(path, busy_timeout=5),
    lambda db, path: db.create_session("m", "python_reference", "pytorch", sesion_id="x"),
    lambda db, path: db.list_sessions(stauts="passed"),
    lambda db, path: db.add_checkpoint_results("s", [], chekpoint="post_mlp"),
], ids=["settings", "create_session", "list_sessions", "add_checkpoint_results"])
def test_a_misspelt_keyword_is_a_type_error_not_ignored(db, db_path, call):
    db.create_session("m", "python_reference", "pytorch", session_id="kept")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        call(db, db_path.with_name("other.db"))
    assert [s["session_id"] for s in db.list_sessions()] == ["kept"]  # nothing created or filtered away
