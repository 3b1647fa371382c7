"""Sweep records, their JUnit XML and their table in the sessions database (fast: no torch run)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from debug_framework.conformance import OpResult, SweepResult, render_junit
from debug_framework.storage.database import Database

EVIL = "op'); DROP TABLE op_sweeps; --\u202e<x>"


def _sweep() -> SweepResult:
    ops = [OpResult("add", "pass", 1.0, counts={"pass": 3, "samples": 3}),
           OpResult(EVIL, "fail", 0.5, "2 of 4 samples: RMSE", {"pass": 2, "fail": 2},
                    {"source": "opinfo", "label": "opinfo[1]", "dtype": "float32", "index": 1,
                     "result": {"status": "fail", "reason": "RMSE <too> big"}}, "/r/repro.py", True),
           OpResult("neg", "hang", 0.0, "no answer"), OpResult("empty", "skipped", None, "uninitialised output"),
           OpResult("nonzero", "unsupported", None, "Dynamo cannot capture it")]
    return SweepResult("k-1", "mine", "cpu", ["float32"], ops, 1.5)


def test_passed_and_json_shape():
    s = _sweep()
    assert [o.passed for o in s.ops] == [True, False, False, None, None]
    d = s.to_dict()
    assert d["passed"] is False and d["failing"] == [EVIL, "neg"]
    assert d["verdicts"]["pass"] == 1 and d["verdicts"]["skipped"] == 1 and d["verdicts"]["unsupported"] == 1
    assert all({"op", "passed"} <= set(o) for o in d["operators"])


def test_junit_one_case_per_operator_escaped():
    root = ET.fromstring(render_junit(_sweep()))
    suite = root.find("testsuite")
    assert suite.get("tests") == "5" and suite.get("failures") == "1" and suite.get("errors") == "1"
    assert suite.get("skipped") == "2"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases[EVIL].find("failure") is not None and "<too>" in cases[EVIL].find("failure").text
    assert cases["neg"].find("error").get("type") == "hang"
    assert cases["add"].find("failure") is None and cases["empty"].find("skipped") is not None


def test_store_round_trip_resume_and_parameterised_sql(tmp_path):
    db = Database(tmp_path / "s.db")
    db.opsweeps.start("k-1", "mine", "cpu", {"dtypes": ["float32"]})
    for o in _sweep().ops:
        db.opsweeps.put("k-1", o.to_dict())
    db.opsweeps.put("k-1", OpResult("add", "fail", 0.0, "again").to_dict())  # replaced, not doubled
    rows = {r["op"]: r for r in db.opsweeps.results("k-1")}
    assert len(rows) == 5 and rows["add"]["verdict"] == "fail" and rows["add"]["passed"] is False
    assert rows[EVIL]["worst"]["result"]["reason"] == "RMSE <too> big" and rows[EVIL]["repro_verified"] is True
    assert rows["empty"]["passed"] is None
    assert OpResult.from_row(rows[EVIL]).to_dict()["pass_rate"] == 0.5
    assert db.opsweeps.done_ops("k-1") == set(rows)
    listed = db.opsweeps.list()
    assert listed[0]["sweep_key"] == "k-1" and listed[0]["verdicts"]["fail"] == 2
    db.opsweeps.start("k-1", "mine", "cpu", {})  # a resumed sweep keeps its rows
    assert len(db.opsweeps.results("k-1")) == 5
    assert db.opsweeps.delete("k-1") and db.opsweeps.results("k-1") == [] and db.opsweeps.get("k-1") is None


def test_a_failing_operators_worst_sample_fails_and_gives_the_reason():
    from debug_framework.conformance.sweep import _aggregate

    def smp(i: int, result: dict) -> dict:
        return {"source": "opinfo", "label": f"opinfo[{i}]", "dtype": "float32", "index": i, "result": result}

    samples = [smp(0, {"status": "pass", "backend_error": 6.8e-7, "bound": 1.6e-6, "reason": None}),
               smp(1, {"status": "fail", "backend_error": 9.5e-8, "bound": 4.6e-7, "reason": "1 non-finite mismatch"}),
               smp(2, {"status": "fail", "backend_error": 2e30, "bound": 2.2e31, "reason": "4 non-finite mismatches"}),
               smp(3, {"status": "error", "reason": "the compiled call raised"})]
    out = _aggregate("interp", samples, [], graphs=1, no_graph="")
    assert out.verdict == "fail" and out.worst is not None and out.worst["index"] == 1
    assert out.reason == "2 of 4 samples: 1 non-finite mismatch"
    passing = _aggregate("interp", samples[:1], [], graphs=1, no_graph="")
    assert passing.verdict == "pass" and passing.worst["index"] == 0
