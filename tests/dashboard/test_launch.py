"""Launching from the dashboard: the task is written first, a real worker process runs it, the page
reads its progress back from the database, and Cancel ends the running session as ``error``."""

from __future__ import annotations

import time

import pytest

from .conftest import run_page

pytest.importorskip("streamlit")


def _wait(predicate, timeout: float = 90.0, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("timed out waiting")


def _task(settings, tid: str) -> dict:
    from debug_framework.storage.database import Database
    from debug_framework.storage.tasks import TaskStore

    db = Database.open_read_only(settings.database)
    try:
        return TaskStore(db).get(tid)
    finally:
        db.close()


def _session(settings, sid: str) -> dict | None:
    from debug_framework.storage.database import Database

    db = Database.open_read_only(settings.database)
    try:
        return db.sessions.get(sid)
    finally:
        db.close()


@pytest.mark.slow
def test_launch_progress_and_cancel_through_worker_processes(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard.launch import CANCELLED, cancel, launch_batch, launch_validation, worker_log_path
    from debug_framework.dashboard.settings import DATABASE_VARIABLE, Settings
    from debug_framework.models.batch_validation_job import item_session_id
    from debug_framework.storage.database import Database

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "launch" / "debug.db"))  # created by the launch
    s = Settings.from_environment()
    quick = launch_validation(s, str(app_env.model), "python_reference", "pytorch", {"dtype": "float32"})
    slow = launch_validation(s, str(app_env.model), "python_reference", "pytorch",
                             {"dtype": "float32", "input_shape": [2048, 64], "oracle": True})
    batch = launch_batch(s, [str(app_env.model), "", str(app_env.model)], "python_reference", "pytorch",
                         {"dtype": "bfloat16"})
    slow_batch = launch_batch(s, [str(app_env.model)] * 2, "python_reference", "pytorch",
                              {"dtype": "float32", "input_shape": [2048, 64], "oracle": True})
    assert _task(s, quick)["state"] in ("queued", "running", "finished")  # in the database at once

    # the page shows the running task with its progress, read back from the database (a reload is a new run)
    _wait(lambda: (_task(s, slow).get("done") or 0) >= 3)  # past load and prepare: the session runs
    at = run_page("jobs.py")
    assert any(slow in m.value for m in at.markdown)
    assert any(slow in str(v) for v in at.dataframe[0].value["task"])
    assert at.get("progress")
    # Cancel from the page: the worker stops, the session ends as error "cancelled", its rows kept
    at.button(key=f"cancel_{slow}").click().run()
    assert not at.exception
    task = _wait(lambda: (t := _task(s, slow))["state"] not in ("queued", "running") and t)
    assert task["state"] == "cancelled" and task["message"] == CANCELLED
    db = Database.open_read_only(s.database)
    row = db.sessions.get(task["session_id"])
    assert row["status"] == "error" and row["error_message"] == CANCELLED
    assert not any(str(row.get(k) or "") == "running" for k in ("status",))

    done = _wait(lambda: (t := _task(s, quick))["state"] not in ("queued", "running") and t)
    assert done["state"] == "finished", done
    assert db.sessions.get(done["session_id"])["status"] == "passed"
    assert done["done"] == done["total"] and done["stage"] == "store"
    assert "already ended" in cancel(s, quick)

    btask = _wait(lambda: (t := _task(s, batch))["state"] not in ("queued", "running") and t)
    assert btask["state"] == "finished" and (btask["done"], btask["total"]) == (2, 2), btask
    job = db.batches.get(btask["job_id"])
    assert job["status"] == "completed" and [i["status"] for i in job["items"]] == ["done", "done"]
    assert all(db.sessions.get(i["session_id"])["status"] == "passed" for i in job["items"])
    db.close()
    # a batch job cancelled while its first model runs: that session ends "cancelled", no item is left to run
    job_id = _task(s, slow_batch)["job_id"]
    sid0 = item_session_id(job_id, 0)
    _wait(lambda: (r := _session(s, sid0)) is not None and r["status"] == "running")
    assert "worker is stopping" in cancel(s, slow_batch)
    ctask = _wait(lambda: (t := _task(s, slow_batch))["state"] not in ("queued", "running") and t)
    assert ctask["state"] == "cancelled", (ctask, worker_log_path(s, slow_batch).read_text(), _session(s, sid0))
    row = _session(s, sid0)
    assert row["status"] == "error" and row["error_message"] == CANCELLED
    db = Database.open_read_only(s.database)
    job = db.batches.get(job_id)
    db.close()
    assert job["status"] == "cancelled" and [i["status"] for i in job["items"]] == ["cancelled", "cancelled"]

    at = run_page("jobs.py")  # finished tasks: in the table, with the job's items
    assert set(at.dataframe[0].value["state"]) == {"finished", "cancelled"}
    assert any(len(d.value) == 2 and "model_path" in d.value.columns for d in at.dataframe[1:])
    bars = [p.proto.text for p in at.get("progress")]
    assert any(f"job {btask['job_id']}: completed (2/2; done 2)" in b.replace("\\", "") for b in bars), bars


def test_a_bad_launch_is_a_message_and_writes_nothing(app_env, tmp_path, monkeypatch):
    from debug_framework.dashboard.launch import launch_batch, launch_validation
    from debug_framework.dashboard.settings import DATABASE_VARIABLE, Settings
    from debug_framework.errors import BackendInitializationError, ModelLoadingError, ValidationError

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "bad" / "debug.db"))
    s = Settings.from_environment()
    with pytest.raises(ValidationError):
        launch_validation(s, "", "python_reference", "pytorch", {})
    with pytest.raises(ValidationError, match="noise_margin"):
        launch_validation(s, str(app_env.model), "python_reference", "pytorch", {"noise_margin": -1.0})
    with pytest.raises(BackendInitializationError, match="did you mean 'pytorch'"):
        launch_validation(s, str(app_env.model), "python_reference", "pytorh", {})
    with pytest.raises(ModelLoadingError):
        launch_batch(s, [str(app_env.model), str(tmp_path / "missing")], "python_reference", "pytorch", {})
    assert not (tmp_path / "bad" / "debug.db").exists()


def test_the_launch_form_writes_a_task_and_its_worker_records_the_failure(app_env, tmp_path, monkeypatch):
    """The Jobs page's form launches a real worker; a model path that does not load ends the task
    as failed with the DF-coded error, shown on the page."""
    from debug_framework.dashboard.settings import DATABASE_VARIABLE, Settings

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "fail" / "debug.db"))
    s = Settings.from_environment()
    at = run_page("jobs.py")
    at.text_input[0].input(str(tmp_path / "no-such-model"))
    at.button[0].click().run()  # a path that does not exist is refused on the page: no task, no worker
    assert not at.exception and not at.success and "DF004" in " ".join(e.value for e in at.error)
    assert not (tmp_path / "fail" / "debug.db").exists()
    (tmp_path / "not-a-model").mkdir()  # exists, but does not load: the worker finds out
    at = run_page("jobs.py")
    at.text_input[0].input(str(tmp_path / "not-a-model"))
    at.selectbox[2].select("bfloat16")  # reference, alternative, dtype
    at.button[0].click().run()  # the form's submit button
    assert not at.exception and "Launched task" in at.success[0].value
    tid = at.success[0].value.split()[2].rstrip(";")
    task = _wait(lambda: (t := _task(s, tid))["state"] not in ("queued", "running") and t)
    assert task["state"] == "failed" and task["message"].startswith("[DF004]"), task
    assert task["request"]["config"]["dtype"] == "bfloat16"
    at = run_page("jobs.py")
    table = at.dataframe[0].value
    assert table.iloc[0]["state"] == "failed" and table.iloc[0]["message"].startswith("[DF004]")
    assert {"verdict", "session"} <= set(table.columns)  # a finished task: its verdict and a link to its session


def test_backend_files_register_their_backends_before_the_task_is_written(app_env, tmp_path, monkeypatch):
    """Issue 30 item 7: the Jobs form's backend-file field. The file is imported on submit (as
    ``--backend-file``), so its backend is accepted and a missing file or an unknown name is refused
    there; the task records the file's absolute path for its worker, which imports it too."""
    from debug_framework.backends import unregister_backend
    from debug_framework.dashboard import launch
    from debug_framework.dashboard.settings import DATABASE_VARIABLE, Settings
    from debug_framework.errors import BackendInitializationError, ConfigurationError, ModelLoadingError
    from debug_framework.storage.database import Database
    from debug_framework.storage.tasks import TaskStore

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "files" / "debug.db"))
    monkeypatch.setattr(launch, "_start_worker", lambda *a: None)  # the worker's side: test_cli_user_backends
    monkeypatch.chdir(tmp_path)
    (tmp_path / "form_backend.py").write_text(
        "from debug_framework.backends import register_backend\n"
        "register_backend('dash_form_backend', 'debug_framework.backends.pytorch:PyTorchBackend')\n")
    s = Settings.from_environment()
    with pytest.raises(ConfigurationError, match="no such file"):
        launch.launch_validation(s, str(app_env.model), "python_reference", "pytorch", {}, ["missing.py"])
    with pytest.raises(ConfigurationError, match="longer than the file system allows"):  # issue 33 item 7
        launch.launch_validation(s, str(app_env.model), "python_reference", "pytorch", {}, ["b" * 5000 + ".py"])
    with pytest.raises(ModelLoadingError, match="longer than the file system allows"):
        launch.launch_batch(s, [str(app_env.model), "/" + "m" * 5000], "python_reference", "pytorch", {})
    assert not (tmp_path / "files" / "debug.db").exists()  # refused on submit: nothing written
    try:
        with pytest.raises(BackendInitializationError, match="did you mean 'dash_form_backend'"):
            launch.launch_validation(s, str(app_env.model), "python_reference", "dash_form_backendd", {},
                                     ["form_backend.py"])
        tid = launch.launch_validation(s, str(app_env.model), "python_reference", "dash_form_backend", {},
                                       [" form_backend.py ", ""])
    finally:
        unregister_backend("dash_form_backend")
    db = Database(s.database)
    try:
        request = TaskStore(db).get(tid)["request"]
    finally:
        db.close()
    assert request["backend_files"] == [str(tmp_path / "form_backend.py")]
    assert request["alternative_backend"] == "dash_form_backend"
