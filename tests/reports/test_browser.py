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
