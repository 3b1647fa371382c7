"""The task store (schema version 5) and the read-only viewer on a version-4 file."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from .conftest import run_page


def test_task_lifecycle_and_owner(tmp_path):
    from debug_framework.errors import ValidationError
    from debug_framework.storage.database import Database
    from debug_framework.storage.leases import current_owner
    from debug_framework.storage.tasks import TaskStore, worker_gone

    db = Database(tmp_path / "t.db")
    tasks = TaskStore(db)
    tid = tasks.create("validation", {"model_path": "m"})
    assert tasks.get(tid)["state"] == "queued" and tasks.get(tid)["request"] == {"model_path": "m"}
    assert tasks.start(tid) and not tasks.start(tid)  # taken once
    task = tasks.get(tid)
    assert (task["owner_pid"], task["owner_token"]) == (current_owner().pid, current_owner().token)
    assert not worker_gone(task)  # this very process
    tasks.update(tid, stage="compare", done=5, total=9)
    tasks.finish(tid, "finished")
    tasks.finish(tid, "failed", "too late")  # an ended task stays as it ended
    assert tasks.get(tid)["state"] == "finished" and tasks.get(tid)["done"] == 5
    with pytest.raises(ValidationError):
        tasks.create("shell", {})
    with pytest.raises(ValueError):
        tasks.update(tid, state="running")  # not a progress column

    # a cancel before any worker took the task: it is never started
    late = tasks.create("validation", {})
    tasks.request_cancel(late)
    assert not tasks.start(late)
    # a worker that died: its task reads as gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tasks.create("validation", {})
    db.run_in_transaction(lambda c: db.execute(
        c, "UPDATE dashboard_tasks SET state = 'running', owner_host = ?, owner_pid = ?, owner_token = 'x'"
           " WHERE task_id = ?", (current_owner().host, int(dead.stdout), gone)))
    assert worker_gone(tasks.get(gone))
    db.close()


def test_viewing_a_version_4_file_reads_it_and_changes_nothing(app_env, tmp_path, monkeypatch):
    """The dashboard opens an older file through a migrated copy: the file stays at version 4."""
    from debug_framework.dashboard.settings import DATABASE_VARIABLE

    old = tmp_path / "v4.db"
    with sqlite3.connect(app_env.database) as src, sqlite3.connect(old) as dst:
        src.backup(dst)  # the WAL's pages included
    with sqlite3.connect(old) as conn:
        conn.execute("DROP TABLE op_sweep_results")  # version 6
        conn.execute("DROP TABLE op_sweeps")
        conn.execute("DROP TABLE dashboard_tasks")  # version 5
        conn.execute("DELETE FROM schema_version WHERE version >= 5")
        conn.execute("PRAGMA journal_mode = DELETE")
    before = old.read_bytes()
    monkeypatch.setenv(DATABASE_VARIABLE, str(old))
    at = run_page()
    assert "4 of 4 sessions" in "\n".join(m.value for m in at.markdown)
    at = run_page("jobs.py")
    assert any("No tasks launched" in i.value for i in at.info)
    assert old.read_bytes() == before


def test_tasks_and_job_list_on_both_engines(any_db_path):
    """What the Jobs page reads, on SQLite and on PostgreSQL: the task store and the job list."""
    from debug_framework.storage.database import Database
    from debug_framework.storage.tasks import TaskStore

    db = Database(any_db_path)
    try:
        tasks = TaskStore(db)
        tid = tasks.create("batch", {"model_paths": ["a", "b"]}, job_id="job1")
        assert tasks.start(tid)
        tasks.update(tid, stage="running", done=1, total=2)
        tasks.finish(tid, "cancelled", "stop")
        assert [(t["task_id"], t["state"], t["done"], t["message"]) for t in tasks.list()] == [(tid, "cancelled", 1, "stop")]
        db.batches.create(["a", "b", "c"], {"reference_backend": "python_reference"}, job_id="job1")
        db.batches.update_item("job1", 0, status="done")
        db.batches.create(["d"], job_id="job2")
        jobs = {j["job_id"]: j for j in db.batches.list()}
        assert jobs["job1"]["counts"] == {"done": 1, "pending": 2} and jobs["job1"]["total"] == 3
        assert jobs["job2"]["counts"] == {"pending": 1} and jobs["job2"]["status"] == "pending"
    finally:
        db.close()
