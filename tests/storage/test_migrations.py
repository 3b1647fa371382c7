"""Old database files (the unversioned prototype "v0" and the first release "v1") walk forward
one version at a time to the current schema, keeping their data. Fixtures are hand-written SQL,
independent of the code that migrates them."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from debug_framework.errors import DatabaseError
from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager

V0_SQL = """
CREATE TABLE debug_sessions (
    session_id TEXT PRIMARY KEY, model_path TEXT, reference_backend TEXT, alternative_backend TEXT,
    config TEXT, created_at TEXT, status TEXT, results TEXT);
INSERT INTO debug_sessions VALUES ('s-old-1', '/m/it''s', 'python_reference', 'metal', '{"a": 1}',
    '2024-01-02T03:04:05+00:00', 'passed', '{"verdict": "passed"}');
INSERT INTO debug_sessions VALUES ('s-old-2', '/m/b', 'python_reference', 'cuda', NULL,
    '2024-01-03T00:00:00+00:00', 'completed', NULL);
"""

V1_SQL = """
CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TEXT NOT NULL);
INSERT INTO schema_version VALUES (1, '2025-01-01T00:00:00+00:00');
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, model_path TEXT NOT NULL, reference_backend TEXT NOT NULL,
    alternative_backend TEXT NOT NULL, config TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL DEFAULT 'created',
    results TEXT, error_message TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE checkpoint_results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
    checkpoint TEXT NOT NULL, layer INTEGER, passed INTEGER, max_abs_error REAL, mean_abs_error REAL,
    metrics_json TEXT, created_at TEXT NOT NULL);
CREATE TABLE tensor_recordings (
    recording_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
    tensor_name TEXT NOT NULL, path TEXT NOT NULL, metadata TEXT, created_at TEXT NOT NULL);
INSERT INTO sessions VALUES ('s1', '/models/tiny', 'python_reference', 'pytorch', '{"seed": 3}', 'failed',
    '{"verdict": "failed"}', 'post_mlp:1 over tolerance', '2025-01-01T00:00:00+00:00', '2025-01-01T00:01:00+00:00');
INSERT INTO sessions VALUES ('s2', '/models/tiny', 'python_reference', 'pytorch', '{}', 'running',
    NULL, NULL, '2025-01-02T00:00:00+00:00', '2025-01-02T00:00:30+00:00');
INSERT INTO checkpoint_results (session_id, checkpoint, layer, passed, max_abs_error, mean_abs_error, metrics_json, created_at)
VALUES ('s1', 'post_mlp', 0, 1, 1e-6, 1e-7, '{"rmse": 2e-7, "cosine_similarity": 0.99999}', '2025-01-01T00:00:10+00:00'),
       ('s1', 'post_mlp', 1, 0, 0.5, 0.01, '{"rmse": 0.02, "tolerance": {"atol": 1e-5}}', '2025-01-01T00:00:11+00:00'),
       ('s1', 'post_mlp', 1, 0, 0.75, 0.02, '{"rmse": 0.03, "tolerance": {"atol": 1e-5}}', '2025-01-01T00:00:12+00:00'),
       ('s1', 'post_processing', NULL, 0, 2.0, 0.1, NULL, '2025-01-01T00:00:13+00:00');
INSERT INTO tensor_recordings VALUES ('r1', 's1', 'post_mlp.1.alternative', 'ab/abcd.safetensors',
    '{"checkpoint": "post_mlp", "layer": 1, "side": "alternative", "shape": [2, 8], "dtype": "float32", "nbytes": 64}',
    '2025-01-01T00:00:12+00:00');
"""


def _fixture(path, sql):
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path))
    conn.executescript(sql)
    conn.commit()
    conn.close()


def test_v0_prototype_file_migrates_step_by_step(db_path):
    _fixture(db_path, V0_SQL)
    db = DatabaseManager(db_path, initialize=False)
    assert db.schema_version() == 0
    assert db.migrate_schema() is True
    assert db.schema_version() == SCHEMA_VERSION
    assert [r["version"] for r in db.execute_query("SELECT version FROM schema_version ORDER BY version")] == list(range(1, SCHEMA_VERSION + 1))
    one = db.get_session("s-old-1")
    assert one["model_path"] == "/m/it's" and one["config"] == {"a": 1} and one["status"] == "passed"
    assert one["results"] == {"verdict": "passed"} and one["finished_at"] is not None
    two = db.get_session("s-old-2")  # an unknown status is kept visible, not silently rewritten
    assert two["status"] == "error" and "'completed'" in two["error_message"] and two["config"] == {}
    assert not db.execute_query("SELECT name FROM sqlite_master WHERE name = 'debug_sessions'")
    db.close()


def test_v1_file_migrates_and_keeps_its_data(db_path):
    _fixture(db_path, V1_SQL)
    db = DatabaseManager(db_path)  # initialize=True migrates on open
    assert db.schema_version() == SCHEMA_VERSION
    s1 = db.get_session("s1")
    assert s1["status"] == "failed" and s1["error_message"] == "post_mlp:1 over tolerance"
    assert s1["config"] == {"seed": 3} and s1["finished_at"] == "2025-01-01T00:01:00+00:00"
    assert db.get_session("s2")["status"] == "running"
    rows = db.get_checkpoint_results("s1")
    assert [(r["checkpoint"], r["layer"]) for r in rows] == [("post_mlp", 0), ("post_mlp", 1), ("post_processing", None)]
    assert rows[1]["max_abs_error"] == 0.75 and rows[1]["rmse"] == 0.03  # the newest duplicate wins
    assert rows[0]["cosine_similarity"] == 0.99999 and rows[0]["passed"] is True
    cols = db.execute_query("SELECT rmse, tolerance FROM checkpoint_results WHERE layer = 1")[0]
    assert cols["rmse"] == 0.03 and json.loads(cols["tolerance"]) == {"atol": 1e-5}
    (rec,) = db.get_tensor_recordings("s1")
    assert (rec["checkpoint"], rec["layer"], rec["side"], rec["shape"], rec["nbytes"]) == ("post_mlp", 1, "alternative", [2, 8], 64)
    # the migrated file is a fully working current database
    db.update_session_status("s2", "passed")
    with pytest.raises(DatabaseError):
        db.execute_query("INSERT INTO checkpoint_results (session_id, checkpoint, layer_key, metrics_json, created_at,"
                         " updated_at) VALUES ('ghost', 'x', -1, '{}', 't', 't')")
    db.delete_session("s1")
    assert db.get_checkpoint_results("s1") == [] and db.get_tensor_recordings("s1") == []
    db.close()


def test_failed_migration_rolls_back_and_keeps_the_old_file(db_path):
    # a v1 file with a result row pointing at a session that does not exist (foreign keys were off)
    _fixture(db_path, V1_SQL + "INSERT INTO checkpoint_results (session_id, checkpoint, layer, metrics_json, created_at)"
                               " VALUES ('ghost', 'post_mlp', 0, '{}', 't');")
    db = DatabaseManager(db_path, initialize=False)
    with pytest.raises(DatabaseError, match="broken references"):
        db.migrate_schema()
    assert db.schema_version() == 1
    assert db.execute_query("SELECT COUNT(*) AS n FROM checkpoint_results")[0]["n"] == 5
    assert "weights_digest" not in {r["name"] for r in db.execute_query("PRAGMA table_info(sessions)")}
    db.close()


_OPEN = textwrap.dedent("""
    import sys
    from debug_framework.services.database_manager import DatabaseManager
    db = DatabaseManager(sys.argv[1], busy_timeout_s=0.1)
    print(db.schema_version())
""")


def test_processes_opening_an_old_file_together_migrate_it_once(db_path):
    _fixture(db_path, V1_SQL)
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN, str(db_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    assert [o.strip() for o, _ in outs] == [str(SCHEMA_VERSION)] * 3
    db = DatabaseManager(db_path)
    assert [r["version"] for r in db.execute_query("SELECT version FROM schema_version ORDER BY version")] == list(range(1, SCHEMA_VERSION + 1))
    assert len(db.get_checkpoint_results("s1")) == 3
    db.close()
