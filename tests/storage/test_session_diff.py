from __future__ import annotations

import math

import pytest

from debug_framework.errors import DatabaseError, ValidationError
from debug_framework.services.session_diff import diff_sessions


def _run(db, make_result, rows, *, digest="d1", alt="pytorch"):
    sid = db.create_session("/models/tiny", "python_reference", alt, weights_digest=digest)
    db.add_checkpoint_results(sid, [make_result(cp, layer, err, passed) for cp, layer, err, passed in rows])
    return sid


def test_diff_names_better_worse_unchanged_new_missing(any_db, make_result):
    db = any_db  # on both engines
    before = _run(db, make_result, [
        ("post_embedding", None, 1e-7, True),
        ("post_mlp", 0, 1e-5, True),      # -> fails: worse
        ("post_mlp", 1, 0.5, False),      # -> passes: better
        ("post_mlp", 2, 1e-3, True),      # -> 1.05e-3: unchanged (within 10 %)
        ("post_mlp", 3, 1e-3, True),      # -> 5e-3 still passing: worse by magnitude
        ("post_mlp", 4, 2e-3, True),      # -> NaN: worse
        ("post_mlp", 5, 1e-3, True),      # gone: missing
    ])
    after = _run(db, make_result, [
        ("post_embedding", None, 1e-7, True),
        ("post_mlp", 0, 0.2, False),
        ("post_mlp", 1, 1e-6, True),
        ("post_mlp", 2, 1.05e-3, True),
        ("post_mlp", 3, 5e-3, True),
        ("post_mlp", 4, math.nan, True),
        ("post_processing", None, 1e-4, True),  # new
    ], digest="d2")
    d = diff_sessions(before, after, db)
    kinds = {(c.checkpoint, c.layer): c.change for c in d.changes}
    assert kinds == {
        ("post_embedding", None): "unchanged", ("post_mlp", 0): "worse", ("post_mlp", 1): "better",
        ("post_mlp", 2): "unchanged", ("post_mlp", 3): "worse", ("post_mlp", 4): "worse",
        ("post_mlp", 5): "missing", ("post_processing", None): "new",
    }
    assert [c.layer for c in d.worse] == [0, 3, 4] and d.to_dict()["counts"]["worse"] == 3
    assert any("weights_digest" in n for n in d.notes)
    strict = diff_sessions(before, after, db, rel_change=0.01)
    assert {(c.checkpoint, c.layer): c.change for c in strict.changes}[("post_mlp", 2)] == "worse"


def test_diff_refuses_sessions_of_different_backends(db, make_result):
    a = _run(db, make_result, [("post_mlp", 0, 1e-5, True)])
    b = _run(db, make_result, [("post_mlp", 0, 1e-5, True)], alt="onnxruntime")
    with pytest.raises(ValidationError, match="alternative_backend differs"):
        diff_sessions(a, b, db)
    assert diff_sessions(a, b, db, require_same_model=False).notes
    with pytest.raises(DatabaseError, match="does not exist"):  # DF003, like every unknown session id
        diff_sessions(a, "ghost", db)


def test_a_change_far_below_the_tolerance_is_not_worse(db, make_result):
    """3.2e-8 -> 3.8e-8 is +19 %, but under an atol of 1e-6 it is rounding noise (the floor is
    atol_fraction of the checkpoint's atol); a real regression of the same relative size still counts."""
    before = _run(db, make_result, [("post_mlp", 0, 3.2e-8, True), ("post_mlp", 1, 3.2e-5, True)])
    after = _run(db, make_result, [("post_mlp", 0, 3.8e-8, True), ("post_mlp", 1, 3.8e-5, True)])
    kinds = {c.layer: c.change for c in diff_sessions(before, after, db).changes}
    assert kinds == {0: "unchanged", 1: "worse"}
    assert {c.layer: c.change for c in diff_sessions(before, after, db, atol_fraction=0).changes}[0] == "worse"


def test_differences_are_listed_leaf_by_leaf_not_as_raw_dicts(db, make_result):
    a = db.create_session("/models/tiny", "python_reference", "pytorch",
                          alternative_backend_info={"name": "pytorch", "torch": "2.13.0", "device": "cpu"})
    b = db.create_session("/models/tiny", "python_reference", "pytorch",
                          alternative_backend_info={"name": "pytorch", "torch": "2.14.0", "device": "cpu",
                                                    "cuda": {"version": "12.4"}})
    d = diff_sessions(a, b, db)
    assert [(x.field, x.before, x.after) for x in d.differences] == [
        ("alternative_backend_info.cuda.version", None, "12.4"),
        ("alternative_backend_info.torch", "2.13.0", "2.14.0"),
    ]
    assert d.notes == ["alternative_backend_info.cuda.version: (not recorded) -> 12.4",
                       "alternative_backend_info.torch: 2.13.0 -> 2.14.0"]
    assert d.to_dict()["differences"][1] == {"field": "alternative_backend_info.torch", "before": "2.13.0",
                                             "after": "2.14.0"}


def test_messages_name_the_callers_options(db, make_result):
    a = _run(db, make_result, [("post_mlp", 0, 1e-5, True)])
    b = _run(db, make_result, [("post_mlp", 0, 1e-5, True)], alt="onnxruntime")
    flags = {"rel_change": "--rel-change", "abs_floor": "--abs-floor", "atol_fraction": "--atol-fraction",
             "require_same_model": "--allow-different-models"}
    with pytest.raises(ValidationError, match="require_same_model=False"):
        diff_sessions(a, b, db)
    with pytest.raises(ValidationError) as info:
        diff_sessions(a, b, db, option_names=flags)
    assert "--allow-different-models" in str(info.value) and "require_same_model" not in str(info.value)
    with pytest.raises(ValidationError) as info:
        diff_sessions(a, a, db, rel_change=-1, option_names=flags)
    assert info.value.message.startswith("--rel-change must be") and "rel_change" not in str(info.value)


def test_decode_sessions_diff_step_by_step(db, make_result):
    """Rows are matched by (checkpoint, layer, step): step 2 of one session against step 2 of the other."""
    def run(errors):
        rows = []
        for step, err in enumerate(errors):
            for cp, layer in (("post_mlp", 0), ("post_processing", None)):
                rows.append({**make_result(cp, layer, err, err < 1e-3), "step": step})
        sid = db.create_session("/models/tiny", "python_reference", "pytorch")
        db.add_checkpoint_results(sid, rows)
        return sid

    before, after = run([1e-5, 1e-5, 1e-5]), run([1e-5, 1e-5, 0.5, 1e-5])
    d = diff_sessions(before, after, db)
    assert [(c.id, c.step, c.change) for c in d.changes] == [
        ("post_mlp:0@0", 0, "unchanged"), ("post_processing@0", 0, "unchanged"),
        ("post_mlp:0@1", 1, "unchanged"), ("post_processing@1", 1, "unchanged"),
        ("post_mlp:0@2", 2, "worse"), ("post_processing@2", 2, "worse"),
        ("post_mlp:0@3", 3, "new"), ("post_processing@3", 3, "new")]
    assert d.to_dict()["changes"][4]["step"] == 2
    plain = diff_sessions(*(_run(db, make_result, [("post_mlp", 0, 1e-5, True)]) for _ in range(2)), db)
    assert [(c.id, c.step) for c in plain.changes] == [("post_mlp:0", None)]  # no decode: no step
