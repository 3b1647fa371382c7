"""The dashboard's runs page finds the tour's runs under the default artifacts folder (issue 30,
item 7): ``debug_artifacts/tour/runs`` is searched as well as ``debug_artifacts`` itself."""

from __future__ import annotations

import json

from debug_module.dashboard_page import runs_under
from debug_module.reports.generator import find_runs


def _run(folder, run_id: str) -> None:
    d = folder / run_id
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"schema": "debug_module.run/1", "run_id": run_id,
                                                 "created": "2026-01-01T00:00:00"}), encoding="utf-8")


def test_runs_directly_under_the_root_and_under_its_runs_folders(tmp_path):
    _run(tmp_path, "20260101T000000-aaaa")
    _run(tmp_path / "tour" / "runs", "20260102T000000-bbbb")
    found = {str(p.relative_to(tmp_path)) for p in runs_under(tmp_path, find_runs)}
    assert found == {"20260101T000000-aaaa", "tour/runs/20260102T000000-bbbb"}


def test_two_runs_of_one_second_are_ordered_by_when_they_were_created(tmp_path):
    from debug_module.reports.generator import run_order

    for run_id, created in (("20260101T000000-ffff", "2026-01-01T00:00:00.100000+00:00"),   # the first
                            ("20260101T000000-0000", "2026-01-01T00:00:00.900000+00:00")):  # then this one
        d = tmp_path / run_id
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"schema": "debug_module.run/1", "run_id": run_id,
                                                     "created": created}), encoding="utf-8")
    runs = runs_under(tmp_path, find_runs)
    assert sorted(runs, key=run_order, reverse=True)[0].name == "20260101T000000-0000"  # what the page shows first
    assert sorted(runs, key=lambda p: p.name, reverse=True)[0].name == "20260101T000000-ffff"  # what the id alone said
