"""Resource management (issue 20): the session time limit, abandoned sessions of killed owners,
engines starting at once, and ``performance_monitoring``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from debug_framework.errors import ResourceExhaustedError
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.services.validation.stages import DEFAULT_STAGES, LoadStage, PrepareStage, Stage
from debug_framework.services.validation_engine import ValidationEngine
from debug_framework.storage.leases import ABANDONED

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import resource_backends  # noqa: E402

#: A model small enough that a validation is a fraction of a second.
NANO = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, vocab_size=256)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _conftest():
    here = str(HERE / "conftest.py")
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == here)


@pytest.fixture(scope="module")
def nano_llama(tmp_path_factory):
    return _conftest().make_tiny("llama", tmp_path_factory.mktemp("nano_llama") / "hf", **NANO)


@pytest.fixture
def behaving():
    names: list[str] = []

    def make(mode: str) -> str:
        names.append(resource_backends.register(f"behaving_{mode}", mode))
        return names[-1]

    yield make
    from debug_framework.backends import unregister_backend

    for n in names:
        unregister_backend(n)


@pytest.mark.slow
def test_a_hanging_backend_is_stopped_at_the_time_limit_and_the_rows_stay(nano_llama, db_path, behaving):
    engine = ValidationEngine(db_path, config={"max_session_duration": 2})
    warm = engine.create_session(nano_llama, {"isolate": False}, "python_reference", "pytorch")
    assert engine.run(warm).verdict == "passed"  # compiled kernels warm: the limit is spent in the hang
    sid = engine.create_session(nano_llama, {"isolate": False, "noise_floor": True}, "python_reference",
                                behaving("hang_second"))
    seen: list[str] = []
    start = time.monotonic()
    with pytest.raises(ResourceExhaustedError, match=r"exceeded max_session_duration \(2 s\)") as info:
        engine.run(sid, progress=lambda stage, *_: seen.append(stage))
    assert time.monotonic() - start < 5  # the hang was cut at the limit, not at the backend's own 60 s
    assert info.value.code == "DF007" and "compare" in seen and "noise floor" not in seen
    stored = engine.get_session_results(sid)
    assert stored["status"] == "error" and "exceeded max_session_duration (2 s)" in stored["error_message"]
    assert len(stored["checkpoints"]) == 4  # the compare stage's rows, written before the limit


class _Sleep(Stage):
    name = "sleep"

    def run(self, ctx) -> None:
        time.sleep(1.2)


@pytest.mark.slow
def test_the_time_limit_stops_a_validation_at_the_next_stage_boundary(nano_llama, db_path):
    stages = (LoadStage(), _Sleep(), PrepareStage(), *DEFAULT_STAGES[2:])
    engine = ValidationEngine(db_path, config={"max_session_duration": 1}, stages=stages)
    sid = engine.create_session(nano_llama, {"isolate": False}, "python_reference", "pytorch")
    seen: list[str] = []
    with pytest.raises(ResourceExhaustedError, match=r"max_session_duration \(1 s\)"):
        engine.run(sid, progress=lambda stage, *_: seen.append(stage))
    assert seen == ["load", "sleep"]
    assert engine.get_session_results(sid)["status"] == "error"
    # no limit: 0 (or None)
    unlimited = ValidationEngine(db_path, config={"max_session_duration": 0}, stages=stages)
    assert unlimited.run(unlimited.create_session(nano_llama, {"isolate": False}, "python_reference",
                                                  "pytorch")).verdict == "passed"


def test_performance_monitoring_off_means_no_profiling(nano_llama, db_path):
    off = ValidationEngine(db_path, config={"performance_monitoring": False})
    sid = off.create_session(nano_llama, {"isolate": False, "profile_memory_usage": True}, "python_reference",
                             "pytorch")
    assert off.get_session_results(sid)["session"]["config"]["performance_profiling_enabled"] is False
    perf = off.run(sid).performance
    assert set(perf) == {"total_s", "note"} and "disabled" in perf["note"]
    on = ValidationEngine(db_path)
    perf = on.run(on.create_session(nano_llama, {"isolate": False}, "python_reference", "pytorch")).performance
    assert "per_layer_s" in perf["alternative"]
    # a session created with profiling on, run by an engine with monitoring off, is not profiled either
    sid = on.create_session(nano_llama, {"isolate": False}, "python_reference", "pytorch")
    assert set(off.run(sid).performance) == {"total_s", "note"}


_OWNER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from resource_backends import register
    from debug_framework.services.validation_engine import ValidationEngine
    engine = ValidationEngine(sys.argv[1], config={"heartbeat_interval": 0.2})
    sid = engine.create_session(sys.argv[2], {"isolate": False}, "python_reference", register("hang", "hang"))
    print(sid, flush=True)
    engine.run(sid)
""")


def _start_engines_at_once(db_path: Path, n: int) -> list[list[str]]:
    """What ``n`` engines started at the same moment (threads) swept."""
    barrier, out = threading.Barrier(n), [None] * n

    def start(i: int) -> None:
        barrier.wait()
        out[i] = ValidationEngine(db_path, config={"maintenance_interval": 0}).maintenance.swept.sessions

    threads = [threading.Thread(target=start, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _status(db: DatabaseManager, sid: str) -> str:
    return db.get_session(sid)["status"]


@pytest.mark.slow
def test_a_killed_owner_is_swept_by_the_next_engine_start_and_never_a_live_one(nano_llama, db_path):
    DatabaseManager(db_path).close()
    owners = [subprocess.Popen([sys.executable, "-c", _OWNER, str(db_path), str(nano_llama), str(HERE)], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        sids = [p.stdout.readline().strip() for p in owners]
        assert all(sids), [p.stderr.read() for p in owners]
        db = DatabaseManager(db_path)
        deadline = time.monotonic() + 60
        while not all(_status(db, s) == "running" for s in sids):
            assert time.monotonic() < deadline and all(p.poll() is None for p in owners)
            time.sleep(0.05)
        # two engines starting at once (and both owners started theirs at about the same time),
        # while both owners run: nothing is swept
        assert _start_engines_at_once(db_path, 2) == [[], []]
        assert [_status(db, s) for s in sids] == ["running", "running"]
        owners[0].send_signal(signal.SIGKILL)
        owners[0].wait(timeout=30)
        assert ValidationEngine(db_path).maintenance.swept.sessions == [sids[0]]  # the next start, not before
        row = db.get_session(sids[0])
        assert row["status"] == "error" and row["error_message"] == ABANDONED
        assert _status(db, sids[1]) == "running" and owners[1].poll() is None
        assert ValidationEngine(db_path, config={"auto_cleanup": False}).maintenance is None
        owners[1].send_signal(signal.SIGKILL)
        owners[1].wait(timeout=30)
        assert _status(db, sids[1]) == "running"  # nobody started an engine yet
        manual = ValidationEngine(db_path, config={"auto_cleanup": False})
        assert manual.run_maintenance(dry_run=True).swept.sessions == [sids[1]]
        assert ValidationEngine(db_path).maintenance.swept.sessions == [sids[1]]
    finally:
        for p in owners:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
