"""Many threads and processes writing sessions at once: no row lost, no "database is locked"."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading

from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager

CHECKPOINTS = [("post_embedding", None), ("post_attention", 0), ("post_mlp", 0), ("post_processing", None)]


def _run_session(db: DatabaseManager, model: str, worker: int, n: int, make_result) -> str:
    sid = db.create_session(model, "python_reference", "pytorch", config={"worker": worker, "n": n}, seed=n)
    db.update_session_status(sid, "running")
    for i, (cp, layer) in enumerate(CHECKPOINTS):
        db.add_checkpoint_result(sid, make_result(cp, layer, 1e-6 * (i + 1), True))
    db.update_session(sid, results={"verdict": "passed", "worker": worker})
    db.update_session_status(sid, "passed" if n % 2 == 0 else "failed")
    return sid


def test_eight_threads_twenty_sessions_each_leave_160_complete_sessions(any_db, make_result):
    db = any_db
    errors: list[BaseException] = []
    made: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker(w: int) -> None:
        try:
            start.wait()
            for n in range(20):
                sid = _run_session(db, f"model-{w}", w, n, make_result)
                with lock:
                    made.append(sid)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(made)) == 160
    counts = db.execute_query("SELECT status, COUNT(*) AS n FROM sessions GROUP BY status ORDER BY status")
    assert counts == [{"status": "failed", "n": 80}, {"status": "passed", "n": 80}]
    per_session = db.execute_query(
        "SELECT s.session_id, COUNT(c.id) AS n, s.finished_at, s.results FROM sessions s"
        " LEFT JOIN checkpoint_results c ON c.session_id = s.session_id GROUP BY s.session_id")
    assert len(per_session) == 160
    assert all(r["n"] == 4 and r["finished_at"] and r["results"] for r in per_session)


_WORKER = textwrap.dedent("""
    import pathlib, sys, time
    from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager
    w = int(sys.argv[2])
    barrier = pathlib.Path(sys.argv[4])  # start together: each marks itself ready, waits for all
    (barrier / f"ready-{w}").touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.glob("ready-*"))) < int(sys.argv[5]) and time.monotonic() < deadline:
        time.sleep(0.005)
    db = DatabaseManager(sys.argv[1], busy_timeout_s=0.2)
    for n in range(int(sys.argv[3])):
        sid = db.create_session(f"model-{w}", "python_reference", "pytorch", config={"worker": w})
        db.update_session_status(sid, "running")
        db.add_checkpoint_results(sid, [
            {"checkpoint": "post_mlp", "layer": i, "passed": True, "max_abs_error": 1e-7 * i} for i in range(4)])
        for i in range(4):  # and a few single-row transactions, to interleave with the others
            db.add_checkpoint_result(sid, {"checkpoint": "post_attention", "layer": i, "passed": True,
                                           "max_abs_error": 2e-7 * i})
        db.update_session_status(sid, "passed")
    print("ok", w)
""")


def test_four_processes_at_once_on_a_new_file(any_db_path, tmp_path):
    db_path = any_db_path
    # every process opens the not-yet-existing database, so schema creation races too
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(db_path), str(w), "40", str(barrier), "4"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "locked" not in err.lower()
    db = DatabaseManager(db_path)
    rows = db.execute_query(
        "SELECT s.status, COUNT(c.id) AS n FROM sessions s JOIN checkpoint_results c"
        " ON c.session_id = s.session_id GROUP BY s.session_id")
    assert len(rows) == 160 and all(r["status"] == "passed" and r["n"] == 8 for r in rows)
    spans = db.execute_query("SELECT MIN(created_at) AS a, MAX(updated_at) AS b FROM sessions"
                             " GROUP BY model_path")  # model-<worker>
    spans.sort(key=lambda s: s["a"])  # the writers really interleaved (2 cores: at least two at once)
    assert any(later["a"] < earlier["b"] for earlier, later in zip(spans, spans[1:]))
    assert db.execute_query("SELECT COUNT(*) AS n FROM schema_version")[0]["n"] == SCHEMA_VERSION  # each step once
    db.close()


_WRITER = textwrap.dedent("""
    import sys
    from debug_framework.models.debug_session import DebugSession
    from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager
    db = DatabaseManager(sys.argv[1])
    s = DebugSession(model_path="/models/llama 'tiny'", reference_backend="python_reference",
                     alternative_backend="pytorch", config={"enabled_checkpoints": ["post_mlp"]},
                     weights_digest="sha256:abc", seed=1234, environment={"python": "3.11"}, db=db)
    s.save()
    s.update_status("running")
    s.add_checkpoint_result("post_mlp", {"layer": 2, "passed": False, "max_abs_error": float("nan"),
                                         "sqnr_db": float("inf"), "tolerance": {"rtol": 1e-4, "atol": 1e-6}})
    s.results = {"verdict": "failed", "first_divergence": {"checkpoint": "post_mlp", "layer": 2}}
    s.save()
    s.update_status("failed")
    print(s.session_id)
""")


def test_session_results_survive_a_process_restart(any_db_path):
    db_path = any_db_path
    out = subprocess.run([sys.executable, "-c", _WRITER, str(db_path)], capture_output=True, text=True,
                         timeout=60, check=True)
    sid = out.stdout.strip()
    from debug_framework.models.debug_session import DebugSession

    s = DebugSession.load(sid, db=str(db_path))
    assert s is not None
    assert (s.model_path, s.status, s.seed, s.weights_digest) == ("/models/llama 'tiny'", "failed", 1234, "sha256:abc")
    assert s.config == {"enabled_checkpoints": ["post_mlp"]}
    assert s.results == {"verdict": "failed", "first_divergence": {"checkpoint": "post_mlp", "layer": 2}}
    assert s.created_at <= s.started_at <= s.finished_at
    (row,) = s.checkpoint_results()
    assert (row["checkpoint"], row["layer"], row["passed"]) == ("post_mlp", 2, False)
    assert math.isnan(row["max_abs_error"]) and row["sqnr_db"] == math.inf
    s.db.close()


def _child_writes(db: DatabaseManager, tag: str) -> None:
    sid = db.create_session(f"child-{tag}", "python_reference", "pytorch")
    db.update_session_status(sid, "running")
    db.add_checkpoint_result(sid, {"checkpoint": "post_mlp", "layer": 0, "passed": True, "max_abs_error": 0.0})
    db.update_session_status(sid, "passed")
    db.close()


def test_manager_is_usable_after_fork_and_in_spawned_processes(any_db):
    db = any_db
    import multiprocessing as mp

    db.create_session("parent", "python_reference", "pytorch")  # parent has an open connection
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        procs = [ctx.Process(target=_child_writes, args=(db, f"{method}-{i}")) for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0], method
    db.create_session("parent-again", "python_reference", "pytorch")  # parent connection still fine
    names = sorted(r["model_path"] for r in db.list_sessions(status="passed"))
    assert names == ["child-fork-0", "child-fork-1", "child-spawn-0", "child-spawn-1"]
    assert len(db.list_sessions()) == 6
