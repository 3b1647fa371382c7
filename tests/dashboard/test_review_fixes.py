"""The dashboard's edge cases: sessions without checkpoint rows, the date filter west of UTC, cancels
that come late, from another host or race the worker's exit, workers that cannot start, bidi
controls and Markdown in user text, and a contributed page named like a built-in one."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from .conftest import HOSTILE, run_page

pytest.importorskip("streamlit")


def _copy(database: Path, to: Path) -> Path:
    """A private copy of the shared sessions' database (its WAL's pages included)."""
    with sqlite3.connect(database) as src, sqlite3.connect(to) as dst:
        src.backup(dst)
    return to


@pytest.fixture
def own_db(app_env, tmp_path, monkeypatch):
    """The app pointed at a private copy of the four sessions."""
    from debug_framework.dashboard.settings import DATABASE_VARIABLE

    path = _copy(app_env.database, tmp_path / "own.db")
    monkeypatch.setenv(DATABASE_VARIABLE, str(path))
    return path


@pytest.fixture
def clean_worker_state(monkeypatch):
    """The worker module's cancel state reset (the worker runs in this process here)."""
    import signal

    from debug_framework.dashboard import worker

    for key in worker._STATE:
        monkeypatch.setitem(worker._STATE, key, False)
    old = signal.getsignal(signal.SIGTERM)
    yield worker
    signal.signal(signal.SIGTERM, old)


def _settings(path: Path):
    from debug_framework.dashboard.settings import Settings

    return Settings(database=path, artifacts=path.parent / "artifacts")


# ------------------------------------------------------------------ 1. sessions without checkpoint rows


def test_curve_frame_without_rows_has_its_columns():
    from debug_framework.dashboard.charts import curve_frame

    frame = curve_frame([], "rmse")
    assert frame.empty and {"order", "checkpoint", "series", "value", "status"} <= set(frame.columns)


def test_session_page_for_a_created_and_an_errored_session(own_db):
    from debug_framework.services.validation_engine import ValidationEngine
    from debug_framework.errors import BackendInitializationError

    engine = ValidationEngine(own_db)
    model = engine.db.sessions.get(engine.db.sessions.list(limit=1)[0]["session_id"])["model_path"]
    created = engine.create_session(model, {"dtype": "float32"}, "python_reference", "pytorch")
    broken = engine.create_session(model, {"dtype": "float32", "device": "cuda:99"}, "python_reference", "pytorch")
    with pytest.raises(BackendInitializationError):  # DF002 at prepare: no checkpoint row written
        engine.run(broken)
    engine.db.close()

    at = run_page("session.py", {"id": created})
    assert "Verdict" in at.info[0].value and "created" in at.info[0].value
    assert any("No finite figures" in i.value for i in at.info)
    at = run_page("session.py", {"id": broken})
    assert "Verdict: **error**" in at.error[0].value
    assert any("DF002" in t.value and "cuda:99" in t.value for t in at.text)


# ------------------------------------------------------------------ 2. the date filter west of UTC


def test_sessions_west_of_utc_and_undated_ones_are_listed(own_db, monkeypatch):
    """With the local date a day behind UTC, a session created (UTC) after local today is listed, and
    one whose creation time cannot be read is kept until the range is changed."""
    sids = [r[0] for r in sqlite3.connect(own_db).execute("SELECT session_id FROM sessions ORDER BY session_id")]
    ahead = (datetime.now(timezone.utc) + timedelta(hours=13)).isoformat(timespec="microseconds")
    with sqlite3.connect(own_db) as conn:
        conn.execute("UPDATE sessions SET created_at = ? WHERE session_id = ?", (ahead, sids[0]))
        conn.execute("UPDATE sessions SET created_at = ? WHERE session_id = ?", ("not a time", sids[1]))
    monkeypatch.setenv("TZ", "Etc/GMT+12")  # UTC-12: local today is behind the UTC date of `ahead`
    time.tzset()
    try:
        at = run_page()
        assert "4 of 4 sessions" in "\n".join(m.value for m in at.markdown)
        start, end = at.date_input[0].value
        assert end >= datetime.fromisoformat(ahead).date()
        at.date_input[0].set_value((start, end)).run()  # the same range: still every row
        assert "4 of 4 sessions" in "\n".join(m.value for m in at.markdown)
        at.date_input[0].set_value((start, start + timedelta(days=400))).run()  # a changed range: dated rows only
        assert "3 of 4 sessions" in "\n".join(m.value for m in at.markdown)
        assert sids[1] not in set(at.dataframe[0].value["session"])
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# ------------------------------------------------------------------ 3. cancelling a finished batch job


def test_cancel_leaves_a_finished_batch_job_as_it_ended(tmp_path):
    import uuid

    from debug_framework.dashboard.launch import cancel, task_store
    from debug_framework.models.batch_validation_job import BatchValidationJob

    path = tmp_path / "debug.db"
    s = _settings(path)
    job = BatchValidationJob(job_id=uuid.uuid4().hex, model_paths=["/m1"], config={"database_path": str(path)})
    db, tasks = task_store(s)
    tid = tasks.create("batch", {"model_paths": ["/m1"]}, job_id=job.job_id)
    tasks.start(tid)
    job.db.batches.update_item(job.job_id, 0, status="done")
    job.db.batches.set_status(job.job_id, "completed")
    tasks.finish(tid, "finished")
    assert "already ended (finished)" in cancel(s, tid)
    stored = job.db.batches.get(job.job_id)
    assert stored["status"] == "completed" and [i["status"] for i in stored["items"]] == ["done"]
    job.db.close()
    db.close()


# ------------------------------------------------------------------ 4 and 6. the worker and a cancel


def test_a_cancel_flagged_in_the_database_stops_a_running_worker(app_env, tmp_path, monkeypatch, clean_worker_state):
    """A dashboard on another host cannot signal the worker: the flag it sets is read at the
    worker's next progress report, and the session ends ``error`` "cancelled"."""
    from debug_framework.dashboard.launch import CANCELLED, task_store
    from debug_framework.storage.tasks import TaskStore

    worker = clean_worker_state
    path = tmp_path / "debug.db"
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(path))
    db, tasks = task_store(_settings(path))
    tid = tasks.create("validation", {"model_path": str(app_env.model), "reference_backend": "python_reference",
                                      "alternative_backend": "pytorch", "config": {"dtype": "float32"}})
    real_start = TaskStore.start

    def start_then_flag(self, task_id):  # the flag is set (by "another host") once the worker took the task
        taken = real_start(self, task_id)
        TaskStore(db).request_cancel(task_id)
        return taken

    monkeypatch.setattr(TaskStore, "start", start_then_flag)
    assert worker.run_task(_settings(path), tid) == 0
    task = tasks.get(tid)
    assert task["state"] == "cancelled" and task["message"] == CANCELLED
    row = db.sessions.get(task["session_id"])
    assert row["status"] == "error" and row["error_message"] == CANCELLED
    db.close()


def test_a_cancel_landing_in_the_engines_failure_handling_still_ends_the_session(app_env, tmp_path, monkeypatch,
                                                                                 clean_worker_state):
    """A resent cancel that interrupts the engine's own "mark the session error" leaves it running;
    the worker ends it."""
    from debug_framework.dashboard.launch import CANCELLED, task_store
    from debug_framework.storage.sessions import SessionStore

    worker = clean_worker_state
    path = tmp_path / "debug.db"
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(path))
    db, tasks = task_store(_settings(path))
    tid = tasks.create("validation", {"model_path": str(app_env.model), "reference_backend": "python_reference",
                                      "alternative_backend": "pytorch", "config": {"dtype": "float32", "device": "cuda:99"}})
    real_update = SessionStore.update_status

    def interrupted(self, session_id, status, error_message=None):  # the resent SIGTERM lands here
        if status == "error" and error_message != CANCELLED:  # the engine's own failure handling
            raise worker.Cancelled()
        return real_update(self, session_id, status, error_message)

    monkeypatch.setattr(SessionStore, "update_status", interrupted)
    assert worker.run_task(_settings(path), tid) == 0
    task = tasks.get(tid)
    assert task["state"] == "cancelled"
    row = db.sessions.get(task["session_id"])
    assert row["status"] == "error" and row["error_message"] == CANCELLED
    db.close()


# ------------------------------------------------------------------ 5. a worker that cannot start or dies early


def test_a_worker_that_cannot_be_started_fails_the_task_with_a_message(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard.launch import launch_validation, task_store
    from debug_framework.dashboard.settings import DATABASE_VARIABLE
    from debug_framework.errors import FrameworkInitializationError

    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(blocker / "logs"))  # the log folder cannot be made
    path = tmp_path / "debug.db"
    with pytest.raises(FrameworkInitializationError, match="could not be started"):
        launch_validation(_settings(path), str(app_env.model), "python_reference", "pytorch", {})
    db, tasks = task_store(_settings(path))
    (task,) = tasks.list()
    assert task["state"] == "failed" and "could not be started" in task["message"]
    db.close()

    monkeypatch.setenv(DATABASE_VARIABLE, str(path))  # the same from the Jobs page's form: a message
    at = run_page("jobs.py")
    at.text_input[0].input(str(app_env.model))
    at.button[0].click().run()
    assert not at.exception and any(e.value.startswith("DF001") for e in at.error)
    assert any("NotADirectoryError" in t.value or "FileExistsError" in t.value for t in at.text)


def test_a_form_error_that_is_not_ours_is_a_message(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard import launch
    from debug_framework.dashboard.settings import DATABASE_VARIABLE

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "debug.db"))

    def broken_disk(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "debug.db"))

    monkeypatch.setattr(launch, "task_store", broken_disk)
    at = run_page("jobs.py")
    at.text_input[0].input(str(app_env.model))
    at.button[0].click().run()
    assert not at.exception
    assert any("PermissionError" in e.value for e in at.error)
    assert any("Permission denied" in t.value for t in at.text)


def test_a_worker_that_dies_before_taking_its_task_reads_as_gone(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard.launch import cancel, launch_validation, task_store
    from debug_framework.dashboard.settings import DATABASE_VARIABLE
    from debug_framework.storage.tasks import worker_gone

    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("PYTHONHOME", str(tmp_path / "no-python-here"))  # the worker's interpreter cannot start
    path = tmp_path / "debug.db"
    s = _settings(path)
    tid = launch_validation(s, str(app_env.model), "python_reference", "pytorch", {})
    monkeypatch.delenv("PYTHONHOME")
    db, tasks = task_store(s)
    task = tasks.get(tid)
    assert task["state"] == "queued" and task["owner_pid"]  # its worker's pid is recorded at once
    end = time.monotonic() + 30
    while not worker_gone(tasks.get(tid)) and time.monotonic() < end:
        time.sleep(0.05)
    assert worker_gone(tasks.get(tid))
    monkeypatch.setenv(DATABASE_VARIABLE, str(path))
    at = run_page("jobs.py")
    assert "worker gone" in set(at.dataframe[0].value["state"])
    assert "cancelled before its worker started" in cancel(s, tid)
    db.close()


# ------------------------------------------------------------------ 10. a cancel racing the worker's exit


def test_a_worker_exiting_as_it_is_signalled_is_reported_not_raised(tmp_path, monkeypatch):
    from debug_framework.dashboard import launch
    from debug_framework.storage.leases import process_owner

    path = tmp_path / "debug.db"
    s = _settings(path)
    db, tasks = launch.task_store(s)
    tid = tasks.create("validation", {})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owner = process_owner(child.pid)
    db.run_in_transaction(lambda c: db.execute(
        c, "UPDATE dashboard_tasks SET state = 'running', owner_host = ?, owner_pid = ?, owner_token = ?"
           " WHERE task_id = ?", (owner.host, owner.pid, owner.token, tid)))
    real_kill = launch.os.kill

    def exits_first(pid, sig):  # the worker ends between the liveness check and the signal
        real_kill(child.pid, 9)
        child.wait()
        real_kill(pid, sig)

    monkeypatch.setattr(launch.os, "kill", exits_first)
    assert "already gone" in launch.cancel(s, tid)
    assert tasks.get(tid)["state"] == "failed"
    db.close()


# ------------------------------------------------------------------ 7 and 8. bidi controls and Markdown


def test_bidi_controls_are_named_in_text_and_markdown():
    from debug_framework.dashboard.data import literal, plain
    from debug_framework.reports._common import BIDI_CONTROLS

    every = "".join(sorted(BIDI_CONTROLS))
    assert "\u061c" in every
    assert not set(plain(f"a{every}b")) & BIDI_CONTROLS and "<U+061C>" in plain("\u061c")
    assert not set(literal(f"a{every}b")) & BIDI_CONTROLS and "U\\+202E" in literal("\u202e")


def test_literal_breaks_every_bare_link_gfm_would_make():
    """Issue 33 item 9: Streamlit's Markdown links ``http://``, ``www.`` and e-mail addresses in
    text it has already unescaped; :func:`literal` breaks each with an invisible word joiner."""
    import re

    from debug_framework.dashboard.data import WORD_JOINER, literal

    gfm = re.compile(r"(?i)https?://|www\.|[\w.+-]+@[\w-]")  # what GFM's autolink literal starts on
    for text in ("http://evil.example", "HTTPS://evil.example/x", "www.evil.example", "WWW.evil.example",
                 "user@evil.example", "mailto:user@evil.example", "a backend named http://evil.example"):
        shown = literal(text)
        unescaped = re.sub(r"\\(.)", r"\1", shown)  # what the renderer sees after the escapes
        assert not gfm.search(unescaped), (text, shown)
        assert unescaped.replace(WORD_JOINER, "") == text  # shown as typed
    assert WORD_JOINER not in literal("post_attention:1 at 3.5e-05")  # ordinary text untouched


def test_sessions_table_cells_name_bidi_controls(app_env):
    at = run_page()
    models = list(at.dataframe[0].value["model"])
    assert not any("\u202e" in m for m in models)
    assert any("<U+202E>" in m for m in models)


def test_plugin_sweep_text_from_the_database_is_not_markdown(tmp_path, monkeypatch):
    from debug_framework.dashboard.settings import DATABASE_VARIABLE
    from debug_framework.storage.database import Database

    path = tmp_path / "plugins.db"
    db = Database(path)
    db.plugins.upsert("demo", "1.0", "cpp", {"id": "demo"})
    db.plugins.set_validation("demo", {"sweep": {"passed": False, "samples": HOSTILE, "seconds": "x", "kernels": {}}})
    db.close()
    monkeypatch.setenv(DATABASE_VARIABLE, str(path))
    at = run_page("plugins.py")
    shown = at.error[0].value
    assert "](javascript:" not in shown and "<script>" not in shown and "**bold**" not in shown
    assert "\u202e" not in shown


# ------------------------------------------------------------------ 9. a contributed page named like a built-in


def test_a_page_named_like_a_built_in_is_reported_not_fatal(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard.extensions import contributed_pages

    info = tmp_path / "clash-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clash\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[debug_framework.dashboard_pages]\njobs = debug_module.dashboard_page:runs_page\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (page,) = [p for p in contributed_pages() if p.name == "jobs"]
    assert page.render is None and "built-in" in page.error
    at = run_page()  # the app still runs, and names the page in the sidebar
    assert any("jobs" in c.value and "built" in c.value for c in at.sidebar.caption)
