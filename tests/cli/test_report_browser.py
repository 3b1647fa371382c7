"""The HTML report renders in headless Chromium with no console errors, with its key sections, and with
user-provided names escaped."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from debug_module.reports import build_report, render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Injected at the top of <head> by the test only: records errors where --dump-dom can read them.
_CAPTURE = """<script>
window.__errors = [];
function __rec(m) { window.__errors.push(String(m)); var e = document.getElementById('__console_errors');
  if (e) { e.textContent = JSON.stringify(window.__errors); } }
window.onerror = function (msg, src, line) { __rec(msg + ' @' + src + ':' + line); };
window.addEventListener('error', function (ev) { if (ev.target && ev.target !== window) { __rec('resource failed: ' + (ev.target.src || ev.target.href)); } }, true);
var __ce = console.error; console.error = function () { __rec(Array.prototype.join.call(arguments, ' ')); __ce.apply(console, arguments); };
document.addEventListener('DOMContentLoaded', function () { var d = document.createElement('pre'); d.id = '__console_errors';
  d.textContent = JSON.stringify(window.__errors); document.body.appendChild(d); });
</script>"""

EVIL = "<script>alert('x')</script>"


def _benchmarks(dir_: Path) -> Path:
    dir_.mkdir()
    (dir_ / "tiny.json").write_text(json.dumps({
        "schema": "debug_module.benchmark/1", "name": "tiny-mlp", "model": EVIL, "device": "cpu",
        "results": [{"backend": "eager", "latency_ms": {"mean": 2.0, "std": 0.1, "median": 2.0, "runs": 10}},
                    {"backend": "inductor", "compile_s": 3.1, "first_call_s": 3.2,
                     "latency_ms": {"mean": 1.0, "std": 0.05, "median": 1.0, "runs": 10},
                     "graph_count": 1, "graph_breaks": 0, "violations": 0, "kerneldiff": "pass"}]}))
    (dir_ / "junk.json").write_text("{not json")
    return dir_


def test_report_escapes_and_reads_benchmarks(artifacts_root, tmp_path):
    data = build_report(artifacts_root["root"], benchmarks_dir=_benchmarks(tmp_path / "bench"))
    # a user-provided model name with markup
    data["runs"][0]["model"] = EVIL
    html = render_html(data, figures=False)
    assert EVIL not in html and "&lt;script&gt;alert(" in html
    assert data["benchmarks"][0]["results"][1]["speedup_vs_eager"] == pytest.approx(2.0)
    assert data["benchmarks_skipped"][0]["file"] == "junk.json"


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_report_renders_in_headless_chromium_without_console_errors(artifacts_root, tmp_path):
    data = build_report(artifacts_root["root"], benchmarks_dir=_benchmarks(tmp_path / "bench"))
    data["runs"][0]["model"] = EVIL
    html = render_html(data).replace("<head>", "<head>" + _CAPTURE, 1)
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom", page.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    dom = p.stdout
    assert "__console_errors" in dom, p.stderr[-2000:]
    start = dom.index('id="__console_errors">') + len('id="__console_errors">')
    errors = json.loads(dom[start:dom.index("</pre>", start)].replace("&quot;", '"'))
    assert errors == []
    for section in ("summary", "constraints", "coverage", "guards", "kerneldiff", "benchmarks", "repros"):
        assert f'<section id="{section}">' in dom
    assert "First divergent module" in dom and "tiny-mlp" in dom and "alert(" not in dom.replace("&lt;script&gt;alert(", "")
    assert dom.count("data:image/png;base64,") >= 3


def test_report_in_a_browser_at_1400px(report_root, browser_page, tmp_path):
    """Issue 17: violations from two runs, a failing and an exact-match KernelDiff, seen at 1400x900 in
    Playwright: no console error (the CSP meta tag blocks nothing the page needs), no horizontal page
    scroll, the key elements present; the screenshot is kept as a test artifact."""
    data = build_report(report_root["root"], benchmarks_dir=_benchmarks(tmp_path / "bench"))
    page = tmp_path / "report.html"
    page.write_text(render_html(data), encoding="utf-8")
    p = browser_page.page
    p.goto(page.resolve().as_uri())
    assert browser_page.errors == []
    assert browser_page.scroll_overflow() == 0
    assert p.locator('meta[http-equiv="Content-Security-Policy"]').count() == 1
    for section in ("summary", "constraints", "coverage", "guards", "kerneldiff", "benchmarks", "repros"):
        assert p.locator(f"section#{section}").count() == 1, section
    assert p.locator("table.violations th", has_text="run").count() >= 2
    assert p.locator("td.run").count() == len([v for r in data["runs"] for v in r["violations"]])
    exact = p.locator("p.exact")
    assert exact.count() == 1 and "bit-identical" in (exact.text_content() or "")
    assert p.locator('img.plot[alt="summary figure"]').count() == 1
    assert p.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    browser_page.screenshot("report-inductor-debug")
