"""The validation report on a phone (390 px) and a desktop (1400 px) (issue 30, items 4 and 5): the
page never scrolls sideways (wide tables scroll inside their box), the nav wraps, operator names in
the drill-down stay on one line, and the culprit is in the verdict box, the nav and first in the
drill-down table. One shared browser; the session is the report fixture's, with the drill-down of a
real run (tests/cli/data/drilldown_result.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import render_html

pytestmark = [pytest.mark.browser]

DRILL = json.loads((Path(__file__).resolve().parents[1] / "cli" / "data" / "drilldown_result.json").read_text())


@pytest.fixture
def report_page(db, build, tmp_path) -> Path:
    b = build(db, bug_layer=1, extra_results={"drilldown": DRILL["drilldown"]})
    page = tmp_path / "report.html"
    page.write_text(render_html(ValidationReport.from_session(b.session_id, db)), encoding="utf-8")
    return page


def test_the_report_at_390_and_1400_px(report_page, browser_page):
    page = browser_page.page
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(report_page.as_uri())
    assert browser_page.scroll_overflow() == 0
    nav = page.evaluate("(() => { const n = document.querySelector('nav'); "
                        "return [n.scrollWidth, n.clientWidth, n.getBoundingClientRect().height]; })()")
    assert nav[0] <= nav[1] and nav[2] > 30  # every link visible, on more than one line
    code = page.evaluate("Array.from(document.querySelectorAll('table.drilldown td code'))"
                         ".map(c => c.getBoundingClientRect().height)")
    line = page.evaluate("parseFloat(getComputedStyle(document.querySelector('table.drilldown td code')).lineHeight)"
                         " || 20")
    assert code and max(code) < 2 * line, "an operator name wraps"
    assert page.evaluate("document.documentElement.scrollHeight") < 12000
    clipped = page.evaluate("Array.from(document.querySelectorAll('#summary table.kv td')).filter(td => "
                            "td.scrollWidth > td.clientWidth + 1 || td.getBoundingClientRect().right > "
                            "window.innerWidth).map(td => td.innerText)")
    assert clipped == [], clipped  # issue 48, item 10: every Session value is whole in view (it wraps)
    browser_page.screenshot("report-390px")

    page.set_viewport_size({"width": 1400, "height": 900})
    assert browser_page.scroll_overflow() == 0
    verdict = page.inner_text("#verdict")
    assert "culprit operator (drill-down): layer 1: aten._softmax.default at model.layers.1.self_attn" in verdict
    assert page.inner_text("nav").splitlines()[0].strip().startswith("culprit operator")
    first = page.query_selector("table.drilldown tr:nth-child(2)")
    assert first.get_attribute("class") == "first" and "_softmax" in first.inner_text()
    assert browser_page.errors == []
