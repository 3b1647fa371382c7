"""The session page of a decode session: the step x layer grid and every step's rows in the
checkpoint table. The session is written through the stores the way the engine writes one (rows
shaped as ``CheckpointResult.to_dict()``, the ``decode`` result as documented in docs/validation.md,
"Decode steps"), in a database of its own (no engine run: one of the tiny Llama costs ~10 s here,
and the page is what this test is about)."""

from __future__ import annotations

import pytest

from .conftest import run_page

pytest.importorskip("streamlit")

LAYERS = (0, 1)
STEPS = (0, 1, 2)


def _row(cp: str, layer: int | None, step: int, margin: float) -> dict:
    name = cp if layer is None else f"{cp}:{layer}"
    passed = margin <= 1
    return {"id": f"{name}@{step}", "checkpoint": cp, "layer": layer, "step": step, "passed": passed,
            "judged_by": "calibrated", "bound": 1e-3, "margin": margin, "max_abs_error": margin * 1e-3,
            "reason": None if passed else f"rmse {margin:.0f} x the bound"}


def _decode_session(database) -> str:
    from debug_framework.storage.database import Database

    rows = []
    for step in STEPS:  # step 2 diverges from layer 1 on (a decode-only bug); the prefill passes
        rows.append(_row("post_embedding", None, step, 0.1))
        for layer in LAYERS:
            bad = step == 2 and layer == 1
            rows += [_row("post_attention", layer, step, 40.0 if bad else 0.2), _row("post_mlp", layer, step, 0.3)]
        rows.append(_row("post_processing", None, step, 50.0 if step == 2 else 0.25))
    first = next(r for r in rows if not r["passed"])
    tokens = [{"step": s, "positions": 2, "kl_divergence": {"mean": 1e-6 if s < 2 else 0.4, "p99": 0.0, "max": 0.0},
               "top1_agreement": 1.0 if s < 2 else 0.5, "topk_overlap": 1.0, "passed": s < 2} for s in STEPS]
    kv = [{"step": s, "layer": layer, "passed": True, "k": {"margin": 0.1, "passed": True},
           "v": {"margin": 0.2, "passed": True}} for s in STEPS for layer in LAYERS]
    results = {"verdict": "failed", "first_divergence": {k: first[k] for k in ("id", "checkpoint", "layer", "step")},
               "decode": {"steps": 2, "token_metrics": tokens, "kv_cache": kv, "first_divergent_token": {
                   "step": 2, "index": [0, 0], "reference_token": 5, "alternative_token": 9, "reference_gap": 0.7}}}
    db = Database(database)
    sid = db.sessions.create("/models/tiny", "float64_eager", "pytorch", config={"decode_steps": 2})
    db.sessions.update_status(sid, "running")
    db.checkpoints.add_many(sid, rows)
    db.sessions.update(sid, results=results)
    db.sessions.update_status(sid, "failed")
    db.close()
    return sid


def test_session_page_of_a_decode_session_shows_the_step_by_layer_grid(tmp_path, monkeypatch):
    from debug_framework.dashboard.settings import ARTIFACTS_VARIABLE, DATABASE_VARIABLE

    database = tmp_path / "decode.db"
    sid = _decode_session(database)
    monkeypatch.setenv(DATABASE_VARIABLE, str(database))
    monkeypatch.setenv(ARTIFACTS_VARIABLE, str(tmp_path / "artifacts"))
    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(tmp_path / "logs"))
    at = run_page("session.py", {"id": sid})
    grid = next(d.value for d in at.dataframe if "KL mean" in d.value.columns)
    assert list(grid["step"]) == list(STEPS)  # the prefill and both decode steps: each kept its own rows
    assert [c for c in grid.columns if c not in ("step", "KL mean", "top-1", "top-k", "tokens")] == [
        "embedding", "0", "1", "head"]
    assert list(grid["1"]) == ["0.3", "0.3", "40 FIRST"]  # the worst margin of each step's layer-1 rows
    assert list(grid["0"]) == ["0.3"] * 3 and list(grid["head"]) == ["0.25", "0.25", "50 FAIL"]
    assert list(grid["tokens"]) == ["pass", "pass", "FAIL"]
    table = at.dataframe[0].value  # the checkpoint table: every step's row, named by its step
    assert list(table["checkpoint"])[:3] == ["post_embedding@0", "post_attention:0@0", "post_mlp:0@0"]
    assert len(table) == 6 * len(STEPS) and "post_attention:1@2" in set(table["checkpoint"])
    kv = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "0", "1"])
    assert list(kv["step"]) == list(STEPS) and set(kv["1"]) == {"0.2"}
    assert "first divergent token: decode step 2" in "\n".join(t.value for t in at.text)
