"""One typed result record: the CLI's JSON, the stored rows and the record read back are one shape,
every checkpoint carries its canonical id, and nothing is repeated."""

from __future__ import annotations

import json

from debug_framework.cli.debug_validate import run
from debug_framework.services.validation.results import CheckpointResult
from debug_framework.services.validation_engine import ValidationEngine


def test_json_rows_and_record_are_one_shape(tiny_llama, db_path, tmp_path, my_backend):
    out = tmp_path / "result.json"
    code = run(["--model-path", str(tiny_llama), "--alternative-backend", my_backend("eps_layer3"),
                "--database", str(db_path), "--isolate", "--output-file", str(out)])
    assert code == 1
    doc = json.loads(out.read_text())
    stored = ValidationEngine(db_path).get_session_results(doc["session_id"])
    rows = stored["checkpoints"]
    assert [r["id"] for r in doc["results"]] == [r["id"] for r in rows]
    assert doc["results"][0]["id"] == "post_embedding" and doc["results"][-1]["id"] == "post_processing"
    assert "post_attention:3" in [r["id"] for r in rows]
    for printed, row in zip(doc["results"], rows, strict=True):
        assert set(printed) <= set(row)  # the stored row is the printed entry plus the database's own columns
        assert {k: row[k] for k in printed} == printed
        back = CheckpointResult.from_row(row)  # read back as the typed record
        assert back.id == row["id"] and back.passed == bool(row["passed"]) and back.judged_by == row["judged_by"]
        assert back.margin == row["margin"] and back.comparison.max_abs_error == row["max_abs_error"]
        assert (back.introduces_error is None) == (row["introduces_error"] is None)
    # the first divergence is named once, by reference; its metrics live in its own entry
    first = doc["first_divergence"]
    assert first["id"] == "post_attention:3" and "worst" not in first and "rmse" not in first
    assert stored["first_divergence"] == stored["summary"]["first_divergence"] == first
    # a layer's entry carries its blocks' judgements in brief, not the checkpoints' metrics again
    layer3 = doc["isolation"][3]
    assert layer3["blocks"] == ["attention"] and layer3["attention"]["input"] == "reference"
    assert set(layer3["attention"]) == {"input", "passed", "judged_by", "bound", "margin", "reason", "rule",
                                        "max_abs_error", "rmse"}
