"""Real validations run concurrently through the engine against ONE database file.

tests/storage/test_concurrency.py hammers the DatabaseManager with synthetic rows; here the whole
path runs at once from many threads (and processes): model loading, both backends, the numba
comparison kernel (OpenMP threading layer, launched from 8 Python threads at a time), isolation,
and the writes. Afterwards every session must be complete, with the verdict and rows it would have
had alone, and nothing may have been shared between sessions by mistake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from debug_framework.services.validation_engine import ValidationEngine


def _conftest():
    """This directory's conftest module (no package here, so no relative import): the one pytest
    already loaded."""
    here = str(Path(__file__).with_name("conftest.py"))
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == here)


#: Worker processes run one intra-op thread each (torch and numba), as N processes on a small
#: machine should: four processes x two spinning OpenMP teams on two cores only measure the spinning.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "NUMBA_NUM_THREADS": "1"}

#: One layer, hidden 32: a validation is a few milliseconds of real work. The vocabulary is wide
#: enough that the logits of most sessions (batch x length >= 16) reach the comparison kernel's
#: parallel path (2 x 65536 elements and up), so threads launch OpenMP teams concurrently; the
#: hidden states stay on its serial path.
MICRO = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=48, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, vocab_size=8192)
KEYS = ["post_embedding", "post_attention:0", "post_mlp:0", "post_processing"]
THREADS, PER_THREAD = 8, 8


@pytest.fixture(scope="module")
def micro_llama(tmp_path_factory):
    return _conftest().make_tiny("llama", tmp_path_factory.mktemp("micro_llama") / "hf", **MICRO)


def _key(row) -> str:
    return row["checkpoint"] if row["layer"] is None else f"{row['checkpoint']}:{row['layer']}"


def _plan(w: int, n: int, buggy: str) -> tuple[dict, str, str]:
    """Session n of thread w: its own input shape (so a row that landed in the wrong session, or
    kernel state shared between threads, shows up in numel / finite_count) and, every fourth
    session, a user backend with the causal-mask bug (expected verdict: failed at
    post_attention:0)."""
    cfg = {"input_shape": [1 + w % 2, 8 + w + n % 3], "seed": 1000 * w + n}
    fails = n % 4 == 3
    return cfg, (buggy if fails else "pytorch"), ("failed" if fails else "passed")


@pytest.mark.slow
def test_eight_threads_eight_real_validations_each(micro_llama, any_db_path, my_backend):
    """8 threads x 8 real validations (python_reference float64 vs pytorch float32, or a buggy
    NumPy user backend) against one database. Threads 0-3 share one engine, threads 4-7 each
    make their own: both ways users write it. Exactly 64 complete sessions come out."""
    db_path = any_db_path  # a SQLite file, then a PostgreSQL server
    buggy = my_backend("causal_mask")
    shared = ValidationEngine(db_path)
    errors: list[tuple[int, int, BaseException]] = []
    expected: dict[str, tuple[str, int]] = {}  # sid -> (verdict, numel of a hidden-state checkpoint)
    returned: dict[str, dict] = {}
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def worker(w: int) -> None:
        engine = shared if w < THREADS // 2 else ValidationEngine(db_path)
        start.wait()
        for n in range(PER_THREAD):
            cfg, alt, verdict = _plan(w, n, buggy)
            try:
                sid = engine.create_session(micro_llama, cfg, "python_reference", alt)
                out = engine.execute_validation(sid)
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                with lock:
                    errors.append((w, n, exc))
                continue
            b, t = cfg["input_shape"]
            real = b * t - (b - 1) * (t // 4)  # the default pads rows after the first by a quarter: not judged
            with lock:
                assert sid not in expected
                expected[sid] = (verdict, real * MICRO["hidden_size"])
                returned[sid] = out

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,), name=f"validator-{w}") for w in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert errors == [], f"{len(errors)} validations raised, first: {errors[:1]!r}"
    total = THREADS * PER_THREAD
    assert len(expected) == total

    # read back through a fresh engine, as another process would
    reader = ValidationEngine(db_path)
    stored = reader.list_sessions()
    ids = [s["session_id"] for s in stored]
    assert len(ids) == total and len(set(ids)) == total and set(ids) == set(expected)
    counts: dict[str, int] = {}
    for sid, (verdict, hidden_numel) in expected.items():
        res = reader.get_session_results(sid)
        assert res["status"] == verdict == returned[sid]["verdict"], (sid, res["status"], res["error_message"])
        assert res["error_message"] is None
        rows = res["checkpoints"]
        assert [_key(r) for r in rows] == KEYS, sid
        for r in rows:
            want = hidden_numel // MICRO["hidden_size"] * MICRO["vocab_size"] if r["checkpoint"] == "post_processing" \
                else hidden_numel
            assert r["numel"] == want, (sid, _key(r), r["numel"], want)
        by_key = {_key(r): r for r in rows}
        ret = {f"{r['checkpoint']}:{r['layer']}" if r["layer"] is not None else r["checkpoint"]: r
               for r in returned[sid]["results"]}
        for k in KEYS:  # what the thread got back is what was stored for that session
            assert bool(by_key[k]["passed"]) == ret[k]["passed"], (sid, k)
            assert by_key[k]["max_abs_error"] == pytest.approx(ret[k]["max_abs_error"], rel=1e-12,
                                                               abs=0.0)
        summary = res["results"]
        assert summary["checkpoints"] == len(KEYS)
        assert summary["isolation"] is not None and [i["layer"] for i in summary["isolation"]] == [0]
        if verdict == "failed":
            assert res["first_divergence"]["checkpoint"] == "post_attention"
            assert res["first_divergence"]["layer"] == 0
            assert summary["introducing_layers"] == [0]
        else:
            assert res["first_divergence"] is None and summary["introducing_layers"] == []
            assert all(r["mismatch_count"] == 0 for r in rows)
        counts[verdict] = counts.get(verdict, 0) + 1
    assert counts == {"passed": total * 3 // 4, "failed": total // 4}
    print(f"\n{total} real validations in {THREADS} threads: {elapsed:.1f} s")


_WORKER = textwrap.dedent("""
    import json, sys
    from debug_framework.services.validation_engine import ValidationEngine
    db, model, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    engine = ValidationEngine(db)
    out = []
    for i in range(n):
        sid = engine.create_session(model, {"input_shape": [2, 4 + worker], "seed": 100 * worker + i},
                                    "python_reference", "pytorch")
        out.append((sid, engine.execute_validation(sid)["verdict"]))
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_four_processes_validate_into_one_database(micro_llama, any_db_path):
    """4 processes, 3 real validations each, started together against one database file."""
    procs, n, db_path = 4, 3, any_db_path
    env = {**ENV, "PIE_DEBUG_ARTIFACT_ROOT": os.environ.get("PIE_DEBUG_ARTIFACT_ROOT", "")}  # a server's files
    ValidationEngine(db_path)  # the schema exists before they start (they would race to create it too)
    running = [subprocess.Popen([sys.executable, "-c", _WORKER, str(db_path), str(micro_llama), str(w), str(n)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for w in range(procs)]
    made: dict[str, str] = {}
    for w, p in enumerate(running):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        for sid, verdict in json.loads(out.strip().splitlines()[-1]):
            assert sid not in made
            made[sid] = verdict
    assert len(made) == procs * n and set(made.values()) == {"passed"}
    reader = ValidationEngine(db_path)
    stored = {s["session_id"]: s for s in reader.list_sessions()}
    assert set(stored) == set(made)
    for sid in made:
        res = reader.get_session_results(sid)
        assert res["status"] == "passed", (sid, res["error_message"])
        assert [_key(r) for r in res["checkpoints"]] == KEYS
