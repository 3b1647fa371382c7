"""The HTML report, round 2 (issue 48, item 10): the Session table names the dtypes, the heatmap
of a small tensor is drawn with readable cells, and the drill-down shows the culprit and its
neighbourhood with the rest of a layer's operators folded in a ``<details>``. Real sessions from the
reports fixture; the drill-down of a real run (tests/cli/data/drilldown_result.json, 98 operators)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import render_html
from debug_framework.reports.html_report import HEAT_MAX_CELL, heat_scale

DRILL = json.loads((Path(__file__).resolve().parents[1] / "cli" / "data" / "drilldown_result.json").read_text())


def _html(db, build, **kwargs) -> str:
    b = build(db, **kwargs)
    return render_html(ValidationReport.from_session(b.session_id, db))


def _section(html: str, sid: str) -> str:
    return html.split(f'<section id="{sid}"')[1].split("</section>")[0]


def test_the_session_table_names_the_dtypes(db, build):
    summary = _section(_html(db, build, bug_layer=1, config={"enabled_checkpoints": "all", "dtype": "bfloat16",
                                                              "reference_dtype": "float64"}), "summary")
    assert re.search(r"<th>dtype</th><td>bfloat16 \(reference float64\)</td>", summary), summary


def test_a_small_heatmap_has_readable_cells():
    assert heat_scale(4, 4) == HEAT_MAX_CELL and 4 * heat_scale(4, 4) >= 200  # a 4 x 4 tensor: 256 px, not 64
    assert heat_scale(2, 1024) == 1  # a wide one still fits (a pixel per cell)
    assert heat_scale(512, 512) == 1


def test_the_report_draws_the_worst_checkpoint_at_a_readable_size(db, build):
    heat = _section(_html(db, build, bug_layer=1), "heatmap")
    width, height = (int(v) for v in re.search(r'<img class="heat"[^>]* width="(\d+)" height="(\d+)"', heat).groups())
    assert min(width, height) >= 200 or max(width, height) >= 800, (width, height)


def test_the_drill_down_shows_the_culprit_and_its_neighbours_and_folds_the_rest(db, build):
    html = _html(db, build, bug_layer=1, extra_results={"drilldown": DRILL["drilldown"]})
    drill = _section(html, "drilldown")
    (entry,) = DRILL["drilldown"]
    total = len(entry["operators"])
    shown, folded = drill.split('<details class="more-operators">')
    shown_rows = re.findall(r"<tr class=\"[^\"]*\"><td>(\d+)</td>", shown)
    folded_rows = re.findall(r"<tr class=\"[^\"]*\"><td>(\d+)</td>", folded)
    assert len(shown_rows) + len(folded_rows) == total and len(shown_rows) <= 2 * 3 + 1 + 5
    culprit = next(r for r in entry["operators"] if r["node"] == entry["culprit"]["node"])
    assert shown_rows[0] == str(culprit["index"])  # the culprit first
    near = {str(r["index"]) for r in entry["operators"] if abs(r["index"] - culprit["index"]) <= 3}
    assert near <= set(shown_rows)
    assert f"{len(folded_rows)} more operators" in folded
