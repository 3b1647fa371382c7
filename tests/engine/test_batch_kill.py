"""A batch executor killed alone (SIGKILL to its pid, not its process group) takes its workers with
it, and the re-run never runs an item twice at once (issue 16, "Batch jobs")."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from debug_framework.models.batch_validation_job import BatchValidationJob, item_session_id
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.storage.leases import _pid_runs

HERE = Path(__file__).resolve().parent
NANO = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, vocab_size=256)
ITEMS = 6

#: The executor: a script file, so the spawned workers import it too and register the backend.
_EXECUTOR = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.environ["RESOURCE_TESTS"])
    from resource_backends import register
    register("slowish", "slow:0.6", os.environ["RESOURCE_MARKERS"])

    if __name__ == "__main__":
        from debug_framework.models.batch_validation_job import BatchValidationJob
        job = BatchValidationJob("killed", sys.argv[2:], {
            "database_path": sys.argv[1], "alternative_backend": "slowish", "isolate": False,
            "parallel_execution": True, "max_concurrent_jobs": 2, "framework_config": {"heartbeat_interval": 0.5}})
        job.execute()
""")


def _conftest():
    here = str(HERE / "conftest.py")
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == here)


def _running_owners(db: DatabaseManager) -> set[int]:
    return {int(i["owner_pid"]) for i in db.get_batch_job("killed")["items"] if i["status"] == "running"}


def _kill_executor_at_random(script: Path, db_path: Path, models: list[str], env: dict, rng: random.Random) -> bool:
    """Start the executor, SIGKILL it alone at a random point while items run; True when it was
    killed (False: it finished first). Its workers must be gone soon after."""
    proc = subprocess.Popen([sys.executable, str(script), str(db_path), *models], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    db = DatabaseManager(db_path)
    deadline = time.monotonic() + 120
    try:
        while not (db_path.exists() and db.get_batch_job("killed") and _running_owners(db)):
            if proc.poll() is not None:
                return False
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        workers = _running_owners(db)
        if proc.poll() is not None:
            return False
        proc.send_signal(signal.SIGKILL)  # the executor alone: its workers are not signalled
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    gone_by = time.monotonic() + 10
    while any(_pid_runs(pid, None) for pid in workers) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not any(_pid_runs(pid, None) for pid in workers), "a worker outlived its killed executor"
    return True


@pytest.mark.slow
def test_killed_executor_takes_its_workers_and_the_rerun_runs_each_item_once(tmp_path):
    nano = _conftest().make_tiny("llama", tmp_path / "nano", **NANO)
    models = []
    for i in range(ITEMS):  # one copy per item: the backend's overlap lock is per model path
        models.append(str(shutil.copytree(nano, tmp_path / f"m{i}")))
    markers = tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "execute_job.py"
    script.write_text(_EXECUTOR)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "RESOURCE_TESTS": str(HERE), "RESOURCE_MARKERS": str(markers)}
    db_path = tmp_path / "batch.db"
    rng = random.Random(int(os.environ.get("BATCH_KILL_SEED", "20")))
    kills = sum(_kill_executor_at_random(script, db_path, models, env, rng) for _ in range(2))
    assert kills >= 1
    sys.path.insert(0, str(HERE))
    import resource_backends

    resource_backends.register("slowish", "slow:0.6", str(markers))
    try:
        job = BatchValidationJob("killed", models, {"database_path": str(db_path), "alternative_backend": "slowish",
                                                    "isolate": False})
        results = job.execute()
    finally:
        from debug_framework.backends import unregister_backend

        unregister_backend("slowish")
    assert not (markers / "OVERLAP").exists(), (markers / "OVERLAP").read_text()
    assert [(r["status"], r["verdict"], r["error"]) for r in results] == [("done", "passed", None)] * ITEMS
    assert [r["session_id"] for r in results] == [item_session_id("killed", i) for i in range(ITEMS)]
    db = DatabaseManager(db_path)
    sessions = db.list_sessions()
    assert sorted(s["session_id"] for s in sessions) == sorted(r["session_id"] for r in results)
    assert {s["status"] for s in sessions} == {"passed"}
    assert job.get_progress()["status"] == "completed"
