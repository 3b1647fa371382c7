"""Owner leases, the stale sweep, and maintenance (retention, orphaned files, database optimisation)
over a database built row by row, no model involved (issue 20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from debug_framework.cli import session_report
from debug_framework.errors import FrameworkInitializationError
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.services.maintenance import artifacts_dir_of, inputs_dir_of, run_maintenance
from debug_framework.services.validation_engine import ValidationEngine
from debug_framework.storage import leases
from debug_framework.storage.tensor_store import RecordingCandidate, TensorStore

OLD = time.time() - 3 * 86400  # mtime of files past every grace period


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _running_session(db: DatabaseManager, sid: str, **owner: object) -> str:
    db.create_session("m", "python_reference", "pytorch", session_id=sid)
    db.update_session_status(sid, "running")  # stamps this process as the owner
    if owner:
        cols = sorted(owner)
        db.execute_query("UPDATE sessions SET " + ", ".join(f"{c} = ?" for c in cols) + " WHERE session_id = ?",
                         (*[owner[c] for c in cols], sid))
    return sid


def test_running_session_records_its_owner_and_the_sweep_spares_live_owners(any_db):
    db = any_db
    me = leases.current_owner()
    _running_session(db, "mine")
    row = db.get_session("mine")
    assert (row["owner_host"], row["owner_pid"], row["owner_token"]) == (me.host, me.pid, me.token)
    assert row["lease_expires_at"] > row["heartbeat_at"] > time.time() - 60
    # a live process of this host (the test's parent), another host with a valid lease, and a
    # reused pid (right pid, wrong start time): only the last one is gone
    _running_session(db, "parent", owner_pid=os.getppid(), owner_token=leases._token(os.getppid()))
    _running_session(db, "remote-live", owner_host="elsewhere", lease_expires_at=time.time() + 60)
    _running_session(db, "reused", owner_token="1")
    _running_session(db, "dead", owner_pid=_dead_pid())
    _running_session(db, "remote-silent", owner_host="elsewhere", lease_expires_at=time.time() - 1)
    assert leases.sweep(db, dry_run=True).sessions == ["reused", "dead", "remote-silent"]
    assert db.get_session("dead")["status"] == "running"  # the dry run changed nothing
    report = leases.sweep(db)
    assert sorted(report.sessions) == ["dead", "remote-silent", "reused"]
    for sid in report.sessions:
        row = db.get_session(sid)
        assert row["status"] == "error" and row["error_message"] == leases.ABANDONED and row["finished_at"]
    assert {s["session_id"] for s in db.list_sessions(status="running")} == {"mine", "parent", "remote-live"}
    assert leases.sweep(db).sessions == []  # a second sweeper finds nothing left to do


def test_sweep_requeues_batch_items_of_dead_owners_only(any_db):
    db = any_db
    db.create_batch_job(["a", "b", "c"], job_id="j")
    for _ in range(3):
        db.claim_batch_item("j")
    db.execute_query("UPDATE batch_job_items SET owner_pid = ? WHERE item_index = 1", (_dead_pid(),))
    assert leases.live_running_items(db, "j") == 2
    assert leases.sweep(db, job_id="j").items == [("j", 1)]
    items = db.get_batch_job("j")["items"]
    assert [i["status"] for i in items] == ["running", "pending", "running"]
    assert items[1]["error_message"].startswith(leases.ABANDONED)
    # an owner that lost its item cannot write its outcome any more; the one holding it can
    db.claim_batch_item("j")
    db.execute_query("UPDATE batch_job_items SET owner_pid = 1 WHERE item_index = 0")
    assert db.batches.update_item("j", 0, status="done", if_owned=True) is False
    assert db.batches.update_item("j", 2, status="done", if_owned=True) is True
    assert [i["status"] for i in db.get_batch_job("j")["items"]] == ["running", "running", "done"]


def test_heartbeat_renews_the_leases_this_process_holds(any_db):
    db = any_db
    with leases.holding(db, 0.05):
        _running_session(db, "s")
        first = db.get_session("s")["heartbeat_at"]
        time.sleep(0.3)
        assert db.get_session("s")["heartbeat_at"] > first
        assert db.get_session("s")["lease_expires_at"] <= time.time() + 4 * 0.05 + 0.1


def test_the_heartbeat_thread_ends_with_its_last_holder_and_starts_again(any_db):
    import threading

    def beats() -> int:
        return sum(t.name == "pie-debug-heartbeat" for t in threading.enumerate())

    db = any_db
    before = beats()
    for _ in range(2):  # a second holder after the first left gets a new thread
        with leases.holding(db, 0.05):
            _running_session(db, f"s{_}")
            first = db.get_session(f"s{_}")["heartbeat_at"]
            time.sleep(0.25)
            assert db.get_session(f"s{_}")["heartbeat_at"] > first and beats() == before + 1
        deadline = time.time() + 5
        while beats() > before and time.time() < deadline:
            time.sleep(0.02)
        assert beats() == before  # no thread (nor its connection) left behind


def _store_blob(store: TensorStore, value: float) -> Path:
    return store.put(torch.full((64,), value)).path


def _finished(db: DatabaseManager, sid: str, days_ago: float, inputs: Path | None = None) -> None:
    db.create_session("m", "python_reference", "pytorch", session_id=sid,
                      inputs_ref=None if inputs is None else str(inputs))
    db.update_session_status(sid, "running")
    db.update_session_status(sid, "passed")
    when = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - days_ago * 86400))
    db.execute_query("UPDATE sessions SET finished_at = ? WHERE session_id = ?", (when, sid))


@pytest.fixture
def cluttered(db_path):
    """A database with exactly: two expired sessions (one with a tensor only it references), a
    recent one, an abandoned one, orphaned inputs (one too young to touch) and orphaned blobs."""
    db = DatabaseManager(db_path)
    store = TensorStore.beside_database(db_path)
    inputs = inputs_dir_of(db.database_path)
    inputs.mkdir()
    files = {name: inputs / f"{name}.safetensors" for name in ("old1", "old2", "new", "gone", "young")}
    for f in files.values():
        f.write_bytes(b"x" * 100)
    _finished(db, "old1", 40, files["old1"])
    _finished(db, "old2", 31, files["old2"])
    _finished(db, "new", 2, files["new"])
    store.record_session(db, "old1", [RecordingCandidate("post_mlp", 0, "reference", torch.full((64,), 1.0))])
    store.record_session(db, "new", [RecordingCandidate("post_mlp", 0, "reference", torch.full((64,), 2.0))])
    orphan = _store_blob(store, 3.0)
    _running_session(db, "crashed", owner_pid=_dead_pid())
    artifacts = artifacts_dir_of(db.database_path)
    folders = {name: artifacts / name for name in ("old1", "new", "gone", "young")}
    for name, folder in folders.items():  # a backend's export folder per session
        (folder / "onnxruntime").mkdir(parents=True)
        (folder / "onnxruntime" / "model.onnx").write_bytes(b"o" * 50)
    for p in [*store.files(), *files.values(), *(f for n, f in folders.items() if n != "young")]:
        if p.name != "young.safetensors":
            os.utime(p, (OLD, OLD))
    return db, store, files, orphan


def _summary(report: dict) -> dict:
    return {k: report[k] for k in ("abandoned_sessions", "expired_sessions", "removed_inputs", "removed_artifacts",
                                   "removed_tensors")}


def test_maintenance_removes_exactly_the_expired_and_the_orphaned_and_dry_run_lists_the_same(cluttered):
    db, store, files, orphan = cluttered
    only_old1 = next(p for p in store.files() if p != orphan and db.recordings.for_session("old1")[0]["path"]
                     in str(p))
    before_files = sorted(store.files())
    dry = run_maintenance(db, dry_run=True, older_than_days=30).to_dict()
    assert sorted(store.files()) == before_files and all(f.exists() for f in files.values())
    assert db.get_session("old1") is not None and db.get_session("crashed")["status"] == "running"
    real = run_maintenance(db, older_than_days=30).to_dict()
    assert _summary(dry) == _summary(real)
    assert real["abandoned_sessions"] == ["crashed"] and real["expired_sessions"] == ["old1", "old2"]
    assert {Path(f["path"]).name for f in real["removed_inputs"]} == {"old1.safetensors", "old2.safetensors",
                                                                      "gone.safetensors"}
    assert {Path(f["path"]) for f in real["removed_tensors"]} == {orphan, only_old1}
    assert sum(f["bytes"] for f in real["removed_inputs"]) == 300
    assert {Path(f["path"]).name: f["bytes"] for f in real["removed_artifacts"]} == {"old1": 50, "gone": 50}
    assert sorted(p.name for p in artifacts_dir_of(db.database_path).iterdir()) == ["new", "young"]
    assert real["freed_bytes"] == (sum(f["bytes"] for f in real["removed_inputs"] + real["removed_artifacts"]
                                       + real["removed_tensors"])
                                   + real["database_bytes_freed"]) > 300
    # what is left is exactly the rest
    assert {s["session_id"] for s in db.list_sessions()} == {"new", "crashed"}
    assert db.get_session("crashed")["error_message"] == "abandoned: owner process gone"
    assert sorted(p.name for p in inputs_dir_of(db.database_path).iterdir()) == ["new.safetensors",
                                                                                 "young.safetensors"]
    assert [p.name[:-12] for p in store.files()] == [db.recordings.for_session("new")[0]["content_hash"]]
    assert real["database_statements"] == ["PRAGMA optimize", "VACUUM"]
    again = run_maintenance(db, older_than_days=30).to_dict()
    assert _summary(again) == {"abandoned_sessions": [], "expired_sessions": [], "removed_inputs": [],
                               "removed_artifacts": [], "removed_tensors": []}


def test_retention_defaults_to_keeping_everything(cluttered):
    db, _store, _files, _orphan = cluttered
    report = run_maintenance(db, dry_run=True)
    assert report.expired_sessions == []
    assert run_maintenance(db, dry_run=True, config={"retention_days": 35}).expired_sessions == ["old1"]


def test_cli_maintenance_dry_run_then_real(cluttered, capsys):
    db, _store, files, _orphan = cluttered
    argv = ["--maintenance", "--database", str(db.database_path), "--older-than", "30", "--json"]
    assert session_report.main([*argv, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] is True and files["old1"].exists()
    assert session_report.main(argv) == 0
    real = json.loads(capsys.readouterr().out)
    assert _summary(dry) == _summary(real) and real["dry_run"] is False and not files["old1"].exists()
    assert session_report.main(["--maintenance", "--database", str(db.database_path)]) == 0
    text = capsys.readouterr().out
    assert "freed" in text and "bytes" in text
    assert session_report.main(["--maintenance", "--database", str(db.database_path), "--older-than", "-1"]) == 2
    assert "--older-than" in capsys.readouterr().err
    assert session_report.main(["--list", "--database", str(db.database_path), "--dry-run"]) == 2
    assert "go with --maintenance" in capsys.readouterr().err
    assert session_report.main(["--maintenance", "--database", str(db.database_path.with_name("none.db"))]) == 2
    assert "DF003" in capsys.readouterr().err and not db.database_path.with_name("none.db").exists()


def test_read_only_commands_never_sweep_nor_optimise(cluttered, capsys):
    db, _store, _files, _orphan = cluttered
    assert session_report.main(["--list", "--database", str(db.database_path), "--json"]) == 0
    assert session_report.main(["--session-id", "new", "--database", str(db.database_path)]) == 0
    capsys.readouterr()
    assert db.get_session("crashed")["status"] == "running"
    assert db.execute_query("SELECT COUNT(*) AS n FROM maintenance_runs")[0]["n"] == 0


def test_engine_start_sweeps_every_time_and_optimises_once_per_interval(cluttered):
    db, _store, _files, _orphan = cluttered
    first = ValidationEngine(db.database_path)
    assert first.maintenance.swept.sessions == ["crashed"] and first.maintenance.optimized
    _running_session(db, "crashed-2", owner_pid=_dead_pid())
    second = ValidationEngine(db.database_path)
    assert second.maintenance.swept.sessions == ["crashed-2"] and not second.maintenance.optimized
    assert ValidationEngine(db.database_path, config={"maintenance_interval": 0}).maintenance.optimized
    _running_session(db, "crashed-3", owner_pid=_dead_pid())
    off = ValidationEngine(db.database_path, config={"auto_cleanup": False})
    assert off.maintenance is None and db.get_session("crashed-3")["status"] == "running"


@pytest.mark.parametrize("key,value", [("max_session_duration", "1h"), ("max_session_duration", -5),
                                       ("heartbeat_interval", 0), ("retention_days", "forever"),
                                       ("maintenance_interval", -1)])
def test_resource_keys_are_checked(db_path, key, value):
    with pytest.raises(FrameworkInitializationError, match=key):
        ValidationEngine(db_path, config={key: value})
