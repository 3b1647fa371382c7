"""The Ray batch executor on a real local Ray cluster (issue 18, "Ray executor"): the driver alone
writes the database, items run as Ray tasks, a lost worker's item runs again, cancel stops the job,
and a re-run neither duplicates nor loses a session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="the Ray executor tests need 'ray' (pip install '.[ray]')")

from debug_framework.models.batch_validation_job import BatchValidationJob, item_session_id  # noqa: E402
from debug_framework.services.validation_engine import ValidationEngine  # noqa: E402

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
NANO = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, vocab_size=256)


def _conftest():
    here = str(HERE / "conftest.py")
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == here)


def _env(markers: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "RAY_TEST_MARKERS": str(markers), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[str]:
    make = _conftest().make_tiny
    return [str(make("llama", tmp_path_factory.mktemp("ray_a") / "hf", **NANO)),
            str(make("qwen2", tmp_path_factory.mktemp("ray_b") / "hf", seed=3, **NANO))]


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    """An in-process Ray instance (2 CPUs, loopback, no dashboard) whose workers register the test backends."""
    markers = tmp_path_factory.mktemp("ray_markers")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             runtime_env={"env_vars": _env(markers), "worker_process_setup_hook": "ray_hooks.setup"})
    yield markers
    ray.shutdown()


def _config(db_path: Path, **extra) -> dict:
    return {"database_path": str(db_path), "alternative_backend": "pytorch", "isolate": False,
            "executor": "ray", "max_concurrent_jobs": 2, **extra}


def _sessions(db_path: Path) -> list[dict]:
    return ValidationEngine(db_path).list_sessions()


def test_ray_job_runs_every_item_once_and_resumes(ray_local, models, tmp_path):
    db_path = tmp_path / "debug.db"
    paths = [models[0], models[1], models[0]]
    seen: list[dict] = []
    job = BatchValidationJob("ray-nightly", paths, _config(db_path))
    results = job.execute(progress=seen.append)
    assert [r["status"] for r in results] == ["done"] * 3, results
    assert [r["session_id"] for r in results] == [item_session_id("ray-nightly", i) for i in range(3)]
    assert {r["verdict"] for r in results} == {"passed"}
    assert seen and seen[-1]["finished"] == 3 and seen[-1]["total"] == 3
    engine = ValidationEngine(db_path)
    for r in results:  # the worker's rows arrived whole: checkpoints, provenance, inputs file
        stored = engine.get_session_results(r["session_id"])
        assert stored["checkpoints"], stored
        assert Path(engine.db.sessions.get(r["session_id"])["inputs_ref"]).is_file()
    assert len(_sessions(db_path)) == 3
    again = BatchValidationJob("ray-nightly", paths, _config(db_path)).execute()
    assert again == results and len(_sessions(db_path)) == 3  # nothing run twice, nothing lost


def test_ray_worker_killed_mid_job_retries_its_item(ray_local, models, tmp_path):
    db_path = tmp_path / "debug.db"
    job = BatchValidationJob("ray-killed", models, _config(db_path, alternative_backend="exit_once", max_retries=2))
    results = job.execute()
    assert (ray_local / "EXITED").exists(), "no Ray worker was lost"
    assert [r["status"] for r in results] == ["done", "done"], results
    assert {r["verdict"] for r in results} == {"passed"}
    sids = sorted(s["session_id"] for s in _sessions(db_path))
    assert sids == sorted(item_session_id("ray-killed", i) for i in range(2))
    assert job.get_progress()["status"] == "completed"


def test_ray_cancel_stops_the_job_and_resume_finishes_it(ray_local, models, tmp_path):
    db_path = tmp_path / "debug.db"
    paths = [models[0]] * 4
    job = BatchValidationJob("ray-cancel", paths, _config(db_path, max_concurrent_jobs=1,
                                                          alternative_backend="slowish"))

    def cancel_after_first(progress: dict) -> None:
        if progress["finished"] >= 1 and progress["status"] == "running":
            job.cancel()

    results = job.execute(progress=cancel_after_first)
    assert job.get_progress()["status"] == "cancelled"
    assert "cancelled" in {r["status"] for r in results}, results
    done_before = {r["session_id"] for r in results if r["status"] == "done"}
    final = BatchValidationJob("ray-cancel", paths, _config(db_path, alternative_backend="slowish")).execute()
    assert [r["status"] for r in final] == ["done"] * 4
    assert done_before <= {r["session_id"] for r in final}
    assert len(_sessions(db_path)) == 4


@pytest.mark.parametrize("any_db_path", ["postgresql"], indirect=True)
def test_ray_driver_ingests_into_postgresql(ray_local, models, any_db_path):
    """The driver's database is a PostgreSQL server: the workers' SQLite rows land there whole."""
    job = BatchValidationJob("ray-pg", models, _config(any_db_path))
    results = job.execute()
    assert [(r["status"], r["verdict"]) for r in results] == [("done", "passed")] * 2, results
    engine = ValidationEngine(any_db_path)
    for r in results:
        assert engine.get_session_results(r["session_id"])["checkpoints"]
    assert BatchValidationJob("ray-pg", models, _config(any_db_path)).execute() == results
    assert len(engine.list_sessions()) == 2


def test_unknown_executor_is_refused(tmp_path):
    from debug_framework.errors import ValidationError

    with pytest.raises(ValidationError, match="unknown batch executor"):
        BatchValidationJob("x", ["m"], {"database_path": str(tmp_path / "d.db"), "executor": "slurm"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_head(ray_bin: Path, address: str, env: dict, head: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while subprocess.run([str(ray_bin), "status", "--address", address], env=env, capture_output=True).returncode:
        assert head.poll() is None, f"ray start --head exited: {head.stderr.read() if head.stderr else ''}"
        assert time.monotonic() < deadline, "the Ray head did not come up in 90 s"
        time.sleep(0.5)


def test_cli_batch_on_a_ray_start_head_cluster(models, tmp_path):
    """``ray start --head`` on loopback, started here; the CLI's driver connects to it by address."""

    ray_bin = Path(sys.executable).parent / "ray"
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, **_env(tmp_path), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}  # loopback only
    temp_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # short: Ray's socket paths have a length limit
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                             "--num-cpus", "2", "--include-dashboard=false", "--disable-usage-stats", "--block",
                             "--temp-dir", temp_dir], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _wait_for_head(ray_bin, address, env, head)
        listing = tmp_path / "models.txt"
        listing.write_text(f"# tonight's models\n{models[0]}\n\n{models[1]}\n")
        db_path = tmp_path / "cli.db"
        argv = [sys.executable, "-m", "debug_framework.cli.debug_batch", str(listing), "--executor", "ray",
                "--ray-address", address, "--database", str(db_path), "--alternative-backend", "pytorch",
                "--no-isolate", "--parallel", "2", "--job-id", "cli-ray", "--json"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        items = json.loads(done.stdout)["items"]
        assert [i["status"] for i in items] == ["done", "done"] and {i["verdict"] for i in items} == {"passed"}
        assert sorted(s["session_id"] for s in _sessions(db_path)) == sorted(
            item_session_id("cli-ray", i) for i in range(2))
    finally:
        head.terminate()
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        try:
            os.killpg(head.pid, signal.SIGKILL)  # whatever of the cluster it started is left
        except ProcessLookupError:
            pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_cli_batch_bad_input_exits_2(tmp_path):
    from debug_framework.cli.debug_batch import main as run

    assert run([str(tmp_path / "missing.txt")]) == 2
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    assert run([str(empty)]) == 2
    listing = tmp_path / "one.txt"
    listing.write_text("m\n")
    assert run([str(listing), "--executor", "slurm"]) == 2


def test_unreachable_ray_address_is_df001_in_bounded_time(tmp_path):
    from debug_framework.errors import FrameworkInitializationError
    from debug_framework.services.ray_executor import check_reachable

    start = time.monotonic()
    with pytest.raises(FrameworkInitializationError, match="127.0.0.1:") as info:
        check_reachable(f"127.0.0.1:{_free_port()}", timeout_s=2.0)
    assert info.value.code == "DF001" and time.monotonic() - start < 5


def test_cli_batch_local_executor(models, tmp_path):
    from debug_framework.cli.debug_batch import main

    listing = tmp_path / "models.txt"
    listing.write_text(f"{models[0]}\n")
    db_path = tmp_path / "local.db"
    argv = [str(listing), "--database", str(db_path), "--alternative-backend", "pytorch", "--no-isolate", "--json"]
    assert main(argv) == 0
    assert len(_sessions(db_path)) == 1
    assert main(argv) == 0 and len(_sessions(db_path)) == 1  # the same list resumes the same job
