"""``session_report --diff`` prints readable tables and speaks in flags; ``--list`` shows the dtype."""

from __future__ import annotations

import json

from debug_framework.cli.session_report import main


def test_diff_prints_what_differs_as_a_table_and_names_flags(db, build, capsys):
    before = build(db, bug_layer=None)
    after = build(db, bug_layer=None, seed=0)
    db.update_session(after.session_id, alternative_backend_info={"name": "pytorch", "torch": "2.14.0",
                                                                  "device": "cpu", "build": {"cuda": None}})
    dbp = str(db.database_path)
    assert main(["--diff", before.session_id, after.session_id, "--database", dbp]) == 0
    out = capsys.readouterr().out
    assert "What differs between the runs" in out and "alternative_backend_info.torch" in out
    assert "2.13.0" in out and "2.14.0" in out and "{'" not in out  # no raw dict
    assert main(["--diff", before.session_id, after.session_id, "--database", dbp, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"field": "alternative_backend_info.torch", "before": "2.13.0", "after": "2.14.0"} in doc["differences"]

    assert main(["--diff", before.session_id, after.session_id, "--database", dbp, "--rel-change", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--rel-change must be" in err and "rel_change" not in err
    other = build(db, alternative_backend="onnxruntime")
    assert main(["--diff", before.session_id, other.session_id, "--database", dbp]) == 2
    err = capsys.readouterr().err
    assert "--allow-different-models" in err and "require_same_model" not in err


def test_list_has_a_dtype_column(db, build, capsys):
    build(db, config={"dtype": "float32", "reference_dtype": "float64"})
    build(db, config={"dtype": "bfloat16"}, seed=2)
    dbp = str(db.database_path)
    assert main(["--list", "--database", dbp]) == 0
    out = capsys.readouterr().out
    assert "dtype" in out and "float64 vs float32" in out and "bfloat16" in out
    assert main(["--list", "--json", "--database", dbp]) == 0
    items = json.loads(capsys.readouterr().out)
    assert {(it["reference_dtype"], it["dtype"]) for it in items} == {("float64", "float32"), (None, "bfloat16")}
