"""JSON, CSV and JUnit XML renderers."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from debug_framework.errors import ValidationError
from debug_framework.models.debug_session import DebugSession
from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import CSV_COLUMNS, render_diff, render_report
from debug_framework.services.session_diff import diff_sessions


def _strict(text: str):
    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


def test_json_report(db, build):
    b = build(db, bug_layer=1)
    rep = ValidationReport.from_session(b.session_id, db)
    doc = _strict(render_report(rep, "json"))
    assert doc["verdict"] == "failed"
    assert doc["first_divergence"] == {"id": "post_mlp:1", "checkpoint": "post_mlp", "layer": 1}
    assert len(doc["checkpoint_results"]) == len(b.results) and "tensors" not in doc
    assert doc["reproduce_command"]["exact"] is True
    assert doc["checkpoint_results"][0]["max_abs_error"] == 0.0
    assert [r["id"] for r in doc["checkpoint_results"][:3]] == ["post_embedding", "post_attention:0", "post_mlp:0"]
    assert doc["checkpoint_results"][-1]["id"] == "post_processing"
    assert doc["summary_statistics"]["first_divergence"]["id"] == "post_mlp:1"


def test_json_include_tensors_returns_the_recorded_values(db, build):
    b = build(db, bug_layer=1, recording_limit=2)
    rep = ValidationReport.from_session(b.session_id, db)
    doc = _strict(render_report(rep, "json", include_tensors=True))
    assert len(doc["tensors"]) == len(rep.tensor_recordings) == 2
    t = doc["tensors"][0]
    original = b.store.get(rep.tensor_recordings[0]["content_hash"]).numpy().reshape(-1)
    assert t["numel"] == original.size and not t["values_truncated"]
    assert np.allclose(t["values"], original) and t["max"] == pytest.approx(float(original.max()))


def test_csv_report(db, build):
    b = build(db, bug_layer=2, checkpoint_name_override="=HYPERLINK(\"http://x\")")
    rep = ValidationReport.from_session(b.session_id, db)
    rows = list(csv.DictReader(io.StringIO(render_report(rep, "csv"))))
    assert tuple(rows[0].keys()) == CSV_COLUMNS and len(rows) == len(b.results)
    assert CSV_COLUMNS[:5] == ("session_id", "index", "id", "checkpoint", "layer")
    flagged = [(r["id"], r["checkpoint"], r["layer"]) for r in rows if r["first_divergence"] == "1"]
    assert flagged == [("post_mlp:2", "post_mlp", "2")]
    assert rows[0]["id"] == "post_embedding" and rows[-1]["id"] == "post_processing"
    by_key = {(r["checkpoint"], r["layer"]): r for r in rows}
    assert float(by_key[("post_mlp", "2")]["max_abs_error"]) == pytest.approx(b.results[6]["max_abs_error"])
    assert by_key[("post_embedding", "")]["passed"] == "1" and by_key[("post_mlp", "3")]["passed"] == "0"
    # a formula-looking name is neutralised, numbers (negative too) are untouched
    assert ("'=HYPERLINK(\"http://x\")", "1") in by_key
    assert all(not r["sqnr_db"].startswith("'") for r in rows)


def test_junit_report_is_valid_xml(db, build):
    b = build(db, bug_layer=2, model_path="/m/\x01bad\x1f<&>\"'")
    rep = ValidationReport.from_session(b.session_id, db)
    root = ET.fromstring(render_report(rep, "junit").encode("utf-8"))
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(b.results) == int(suite.get("tests"))
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == sum(not r["passed"] for r in b.results) == int(suite.get("failures"))
    first = next(c for c in cases if c.get("name") == "post_mlp:2")
    msg = first.find("failure").get("message")
    assert "[first divergence]" in msg and "max_abs_error=" in msg
    assert "max_ulp_error" in first.find("failure").text
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["first_divergence"] == "post_mlp:2" and props["model_path"] == "/m/\ufffdbad\ufffd<&>\"'"


def test_junit_error_session(db):
    s = DebugSession(model_path="/m", reference_backend="a", alternative_backend="b", db=db)
    s.save()
    s.update_status("error", "out of memory")
    root = ET.fromstring(render_report(ValidationReport.from_session(s.session_id, db), "junit"))
    suite = root.find("testsuite")
    assert suite.get("errors") == "1" and suite.find("testcase/error").get("message") == "out of memory"


def test_save_to_file_all_formats(db, build, tmp_path):
    b = build(db, bug_layer=None)
    rep = ValidationReport.from_session(b.session_id, db)
    for fmt in ("json", "html", "csv", "junit"):
        assert rep.save_to_file(tmp_path / f"r.{fmt}", format=fmt)
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    ET.parse(tmp_path / "r.junit")
    with pytest.raises(ValidationError):
        render_report(rep, "pdf")


def test_diff_json_and_csv(db, build):
    a = build(db, bug_layer=None)
    b = build(db, bug_layer=2)
    diff = diff_sessions(a.session_id, b.session_id, db)
    doc = _strict(render_diff(diff, "json"))
    assert doc["counts"]["worse"] == len(diff.worse) > 0
    assert [c["id"] for c in doc["changes"]] == [c.id for c in diff.changes]
    second = doc["changes"][1]
    assert (second["id"], second["checkpoint"], second["layer"]) == ("post_attention:0", "post_attention", 0)
    rows = list(csv.DictReader(io.StringIO(render_diff(diff, "csv"))))
    assert [r["change"] for r in rows] == [c.change for c in diff.changes]
    assert [r["id"] for r in rows] == [c.id for c in diff.changes] and rows[0]["id"] == "post_embedding"
