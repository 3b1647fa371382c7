"""Judge as evidence arrives, write each row once: in one session (isolation on, a failing
alternative, so the precision stage runs too) every checkpoint row goes to the database exactly
once, judged on all the evidence, and the judge runs a bounded number of times; a stage that fails
keeps the rows measured before it, each written once."""

from __future__ import annotations

from collections import Counter

import pytest

from debug_framework.services.validation import context as context_module
from debug_framework.services.validation.stages import DEFAULT_STAGES, Stage, StoreStage
from debug_framework.services.validation_engine import ValidationEngine


@pytest.fixture
def counted(monkeypatch):
    """Counts of the judge's calls and of each row's writes, by (checkpoint, layer, step)."""
    calls = {"judge": 0}
    writes: Counter = Counter()
    judge = context_module.judge

    def counting_judge(*args, **kwargs):
        calls["judge"] += 1
        return judge(*args, **kwargs)

    monkeypatch.setattr(context_module, "judge", counting_judge)
    from debug_framework.storage.checkpoint_rows import RESULT_COLUMNS
    from debug_framework.storage.checkpoints import CheckpointResultStore

    add_encoded = CheckpointResultStore.add_encoded  # add_many writes through it too
    at = [RESULT_COLUMNS.index(c) for c in ("checkpoint", "layer", "step")]

    def counting_add_encoded(self, session_id, rows):
        writes.update(tuple(row[i] for i in at) for row in rows)
        return add_encoded(self, session_id, rows)

    monkeypatch.setattr(CheckpointResultStore, "add_encoded", counting_add_encoded)
    return calls, writes


def test_each_row_is_written_once_and_the_judge_runs_a_few_times(tiny_llama, db_path, my_backend, counted):
    calls, writes = counted
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, {"isolate": True, "input_shape": [1, 8]}, "python_reference",
                                my_backend("rope"))
    result = engine.run(sid)
    assert result.verdict == "failed" and result.isolation  # compare, isolation and precision all ran
    assert len(writes) == len(result.results) and set(writes.values()) == {1}, writes
    stored = engine.db.checkpoints.for_session(sid)
    assert [r["id"] for r in stored] == [r.id for r in result.results]  # model order
    assert {r["id"]: r["passed"] for r in stored} == {r.id: r.passed for r in result.results}
    assert calls["judge"] <= 4, calls  # the precision stage's question, the record and the store stages


class _Explode(Stage):
    name = "explode"

    def run(self, ctx):
        raise RuntimeError("a stage crashed")


def test_a_failing_stage_keeps_the_rows_each_written_once(tiny_llama, db_path, counted):
    _, writes = counted
    stages = list(DEFAULT_STAGES)
    stages.insert(stages.index(next(s for s in stages if isinstance(s, StoreStage))), _Explode())
    engine = ValidationEngine(db_path, stages=stages)
    sid = engine.create_session(tiny_llama, {"isolate": False, "input_shape": [1, 8]}, "python_reference", "pytorch")
    with pytest.raises(RuntimeError, match="a stage crashed"):
        engine.run(sid)
    stored = engine.db.checkpoints.for_session(sid)
    assert stored and all(r["passed"] for r in stored) and set(writes.values()) == {1}
    assert engine.db.sessions.get(sid)["status"] == "error"


def test_a_decode_s_evidence_is_judged_once_after_its_stage(tiny_llama, db_path, counted):
    """The decode stage judges its evidence; the store stage writes that verdict, not judged again."""
    calls, writes = counted
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, {"isolate": False, "input_shape": [1, 8], "decode_steps": 2},
                                "float64_eager", "pytorch")
    result = engine.run(sid)
    assert result.verdict == "passed" and any(r.step == 2 for r in result.results)
    assert calls["judge"] == 1, calls
    assert len(writes) == len(result.results) and set(writes.values()) == {1}


def test_the_verdict_is_judged_anew_once_the_evidence_changes():
    """:func:`evidence_state` tells the same evidence from evidence a stage added to or replaced."""
    from dataclasses import replace

    from debug_framework.capture.keys import CheckpointKey
    from debug_framework.comparison import ComparisonResult, Tolerance
    from debug_framework.services.validation.context import evidence_state
    from debug_framework.services.validation.evidence import CheckpointEvidence, Evidence, KVEvidence

    comparison = ComparisonResult(True, None, Tolerance(rtol=0.0, atol=0.0))
    ev = CheckpointEvidence(CheckpointKey("post_mlp", 0), comparison)
    evidence, plan = Evidence(checkpoints=[ev]), object()
    before = evidence_state(evidence, plan)
    assert before.same_as(evidence_state(evidence, plan))
    ev.noise = comparison  # a slot set anew
    assert not before.same_as(now := evidence_state(evidence, plan))
    evidence.kv_cache.append(KVEvidence(1, 0, "k", comparison, None, 1.0))  # a list appended to
    assert not now.same_as(later := evidence_state(evidence, plan))
    evidence.isolation_note = "replaced"  # a field set anew
    assert not later.same_as(evidence_state(evidence, plan))
    assert not later.same_as(evidence_state(replace(evidence), plan))  # another record, same members
    assert not evidence_state(evidence, plan).same_as(evidence_state(evidence, object()))  # another plan
