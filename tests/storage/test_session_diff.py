from __future__ import annotations

import math

import pytest

from debug_framework.errors import DatabaseError, ValidationError
from debug_framework.services.session_diff import diff_sessions


def _run(db, make_result, rows, *, digest="d1", alt="pytorch"):
    sid = db.create_session("/models/tiny", "python_reference", alt, weights_digest=digest)
    db.add_checkpoint_results(sid, [make_result(cp, layer, err, passed) for cp, layer, err, passed in rows])
    return sid


def test_diff_names_better_worse_unchanged_new_missing(db, make_result):
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
