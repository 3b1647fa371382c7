"""One result from end to end: what a validation stores reads back as the same typed
:class:`ValidationResult` (``ValidationResult.load``), for a prefill session with isolation and for
a decode session whose bug shows only at a decode step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from debug_framework.errors import DatabaseError
from debug_framework.jsonio import dumps_json
from debug_framework.services.validation.results import ValidationResult
from debug_framework.services.validation_engine import ValidationEngine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.decode_bugs import register_decode_bug
    from benchmarks.models.tiny_transformers import make_model
    from debug_framework.backends import unregister_backend

    tmp = tmp_path_factory.mktemp("result_load")
    name = register_decode_bug("rope_wrong_position")
    yield make_model("llama", tmp / "llama", 0), name
    unregister_backend(name)


def _same(a: ValidationResult, b: ValidationResult) -> None:
    """The same JSON, but for the performance figures, which keep growing after the summary was
    written (the store stage's own timings, the memory peak)."""
    da, db = (json.loads(dumps_json(r.to_dict())) for r in (a, b))
    pa, pb = da.pop("performance"), db.pop("performance")
    assert da == db
    assert pb and set(pb) <= set(pa)


def test_an_isolated_session_reads_back_as_the_result_that_was_stored(models, tmp_path):
    model, _ = models
    engine = ValidationEngine(tmp_path / "r.db")
    sid = engine.create_session(str(model), {"isolate": True}, "python_reference", "pytorch")
    result = engine.run(sid)
    loaded = ValidationResult.load(tmp_path / "r.db", sid)
    _same(result, loaded)
    assert loaded.isolation is not None and [lr.layer for lr in loaded.isolation] == [lr.layer for lr in result.isolation]
    assert [r.id for r in loaded.results] == [r.id for r in result.results]
    first, original = loaded.results[0], result.results[0]
    assert (first.judged_by, first.bound, first.comparison.max_abs_error) == (
        original.judged_by, original.bound, original.comparison.max_abs_error)
    assert loaded.verdict == result.verdict == "passed"


def test_a_decode_bug_reads_back_with_its_step_layer_and_block(models, tmp_path):
    model, backend = models
    engine = ValidationEngine(tmp_path / "d.db")
    sid = engine.create_session(str(model), {"isolate": True, "decode_steps": 3}, "python_reference", backend)
    result = engine.run(sid)
    loaded = ValidationResult.load(engine.db, sid)
    _same(result, loaded)
    assert loaded.verdict == "failed"
    first = loaded.first_divergence
    assert first is not None and first.step == 1 and first.judgement.rule == result.first_divergence.judgement.rule
    assert loaded.error_source == result.error_source and loaded.error_source["step"] == 1


def test_loading_a_session_that_does_not_exist_is_df003(tmp_path):
    engine = ValidationEngine(tmp_path / "e.db")
    with pytest.raises(DatabaseError) as err:
        ValidationResult.load(engine.db, "nope")
    assert err.value.code == "DF003"
