"""Sessions survive a process restart; batch jobs run in parallel processes and resume after a
real kill with no duplicate and no lost session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from debug_framework.models.batch_validation_job import BatchValidationJob, item_session_id
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.services.validation_engine import ValidationEngine

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _assert_complete(db_path, job_id, n):
    db = DatabaseManager(db_path)
    job = db.get_batch_job(job_id)
    assert [i["status"] for i in job["items"]] == ["done"] * n
    sids = [i["session_id"] for i in job["items"]]
    assert sids == [item_session_id(job_id, i) for i in range(n)]
    sessions = db.list_sessions()
    assert sorted(s["session_id"] for s in sessions) == sorted(sids)  # no duplicate, none lost
    assert {s["status"] for s in sessions} == {"passed"}
    for sid in sids:
        assert len(db.get_checkpoint_results(sid)) == 14


def test_batch_job_killed_midway_resumes(tiny_llama, tiny_qwen2, db_path):
    models = [str(tiny_llama), str(tiny_qwen2)] * 3
    script = """
        import sys
        from debug_framework.models.batch_validation_job import BatchValidationJob
        if __name__ == "__main__":
            job = BatchValidationJob("nightly", sys.argv[2:], {"database_path": sys.argv[1],
                 "alternative_backend": "pytorch", "isolate": False, "noise_floor": True})
            job.execute()
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(db_path), *models], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    db = None
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            if db_path.exists():
                db = db or DatabaseManager(db_path)
                job = db.get_batch_job("nightly")
                if job and sum(i["status"] == "done" for i in job["items"]) >= 2:
                    break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # really kill it, mid-way
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    job = db.get_batch_job("nightly")
    done_before = {i["item_index"]: i["session_id"] for i in job["items"] if i["status"] == "done"}
    assert 2 <= len(done_before) < len(models)
    # what the killed process recorded survives it: read back here, in another process
    engine = ValidationEngine(db_path)
    for sid in done_before.values():
        stored = engine.get_session_results(sid)
        assert stored["status"] == "passed" and len(stored["checkpoints"]) == 14
        assert stored["results"]["noise_floor"]["alternative"]["deterministic"] is True
        assert os.path.isfile(stored["session"]["inputs_ref"])

    rerun = BatchValidationJob("nightly", models, {"database_path": str(db_path), "alternative_backend": "pytorch",
                                                   "isolate": False, "noise_floor": True})
    results = rerun.execute()
    assert [r["verdict"] for r in results] == ["passed"] * len(models)
    for idx, sid in done_before.items():  # what was done is kept, not re-run
        assert results[idx]["session_id"] == sid
    _assert_complete(db_path, "nightly", len(models))
    assert rerun.get_progress()["percent"] == 100.0 and rerun.get_progress()["status"] == "completed"


def test_batch_job_in_parallel_processes(tiny_llama, tiny_qwen2, any_db_path, tmp_path):
    db_path = any_db_path  # a SQLite file, then a postgresql:// URL: the spawned workers reach the server
    models = [str(tiny_llama), str(tiny_qwen2), str(tmp_path / "missing-model")]
    seen = []
    job = BatchValidationJob("par", models, {"parallel_execution": True, "max_concurrent_jobs": 2,
                                             "database_path": str(db_path), "alternative_backend": "pytorch"})
    results = job.execute(progress=seen.append)
    assert [r["status"] for r in results] == ["done", "done", "failed"]
    assert "DF004" in results[2]["error"] and results[2]["session_id"] is None
    assert seen and seen[-1]["finished"] == 3
    # executing a finished job again does nothing new
    again = BatchValidationJob("par", models, {"database_path": str(db_path), "alternative_backend": "pytorch"})
    assert [r["session_id"] for r in again.execute()] == [r["session_id"] for r in results]
    assert len(DatabaseManager(db_path).list_sessions()) == 2


def test_batch_cancel_then_resume(tiny_llama, db_path):
    job = BatchValidationJob("c", [str(tiny_llama)] * 2, {"database_path": str(db_path),
                                                          "alternative_backend": "pytorch", "isolate": False})
    assert job.cancel()
    assert job.get_progress()["cancelled"] == 2 and job.execute() == job.results()
    assert job.get_progress()["done"] == 2


def test_batch_job_id_reuse_with_other_models_is_refused(tiny_llama, db_path):
    from debug_framework.errors import ValidationError

    BatchValidationJob("x", [str(tiny_llama)], {"database_path": str(db_path)})
    with pytest.raises(ValidationError, match="other model paths"):
        BatchValidationJob("x", [str(tiny_llama)] * 2, {"database_path": str(db_path)})
