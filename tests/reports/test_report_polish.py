"""The HTML report as a reader sees it (issue 17): exact SQNR, collapsed tolerances, peak memory in
binary units, the input sentences one per line and in the reproduce command, long strings that wrap,
and Unicode bidi controls neutralised."""

from __future__ import annotations

import html
import math
import re
import shutil
import subprocess

import pytest

from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import neutralise_bidi, render_html
from debug_framework.reports._common import human_bytes, reproduce_command, shell_quote
from debug_framework.reports._html import esc, kv_table, line_chart
from debug_framework.reports._sections import memory_cell, tolerances_section
from debug_framework.services.validation.results import CheckpointResult, ValidationResult
from debug_framework.storage.session_record import SessionRecord

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
#: sentences a user may pass with --text: commas, quotes, shell syntax, a newline, a bidi override
HOSTILE = ["Hello, world!", "it's \"quoted\" $(touch /tmp/pwned) `id` ; rm -rf ~ #", "two\nlines",
           "abc\u202edcba", "tab\there"]


def _chart(page: str, chart_id: str) -> str:
    start = page.index(f'data-chart="{chart_id}"')
    return page[start:page.index("</svg>", start)]


def test_exact_sqnr_is_an_exact_marker_not_the_nan_cross():
    labels = ["post_embedding", "post_attention:0", "post_mlp:0"]
    svg = line_chart("SQNR", labels, [("sqnr_db", [math.inf, 80.0, 60.0], "#2b6cb0")], log=False, inf_is_exact=True)
    assert 'class="exact"' in svg and 'class="nonfinite"' not in svg
    assert 'data-marker="exact-top"' in svg and "exact match (+inf)" in svg  # the chart's own legend
    # NaN stays the magenta cross, with its own legend entry, distinct from exact
    svg = line_chart("SQNR", labels, [("sqnr_db", [math.inf, math.nan, 60.0], "#2b6cb0")], log=False,
                     inf_is_exact=True)
    assert svg.count('class="exact"') == 1 and svg.count('class="nonfinite"') == 1
    assert 'data-marker="nonfinite"' in svg
    # without the flag (an error metric) +inf is non-finite, as before
    assert 'class="nonfinite"' in line_chart("err", labels, [("e", [math.inf, 1.0, 2.0], "#000")], log=True)


def test_sqnr_chart_of_a_session_with_an_exact_checkpoint(db, build):
    b = build(db, bug_layer=2)
    assert b.results[0]["checkpoint"] == "post_embedding" and b.results[0]["max_abs_error"] == 0  # a lookup: exact
    page = ValidationReport.from_session(b.session_id, db).generate_html_report()
    sqnr = _chart(page, "sqnr_db")
    assert 'class="exact"' in sqnr and 'class="nonfinite"' not in sqnr


def test_identical_tolerance_tables_collapse_into_one():
    tol = {"rtol": 1e-4, "atol": 1e-4, "pass_rule": "allclose"}
    session = SessionRecord("s", tolerances={"governing_dtype": "float32",
                                             "per_checkpoint": {f"post_mlp:{i}": dict(tol) for i in range(6)}
                                             | {"post_processing": {**tol, "atol": 1e-3}}})
    rows = [CheckpointResult.from_row({"checkpoint": "post_mlp", "layer": i, "passed": True, "tolerance": dict(tol)})
            for i in range(6)]
    out = tolerances_section(session, rows)
    session_part = out[out.index('class="tol-session"'):out.index('class="tol-used"')]
    assert session_part.count("<th>rtol</th>") == 2  # two distinct tolerances, not seven tables
    assert "6 checkpoint(s): post_mlp:0, post_mlp:1, post_mlp:2, post_mlp:3, post_mlp:4, post_mlp:5" in out
    assert "1 checkpoint(s): post_processing" in out
    used = out[out.index('class="tol-used"'):]
    assert used.count("<th>rtol</th>") == 1 and "all 6 checkpoint(s): post_mlp:0, post_mlp:1" in used


@pytest.mark.parametrize(("n", "text"), [(512, "512 B"), (1536, "1.50 KiB"), (69996544, "66.8 MiB"),
                                         (1060003840, "1011 MiB"), (2.5 * 2**30, "2.50 GiB"), (None, "")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_peak_memory_in_binary_units():
    cell = memory_cell({"baseline_bytes": 990007296, "delta_bytes": 69996544, "method": "rss_vmhwm",
                      "peak_bytes": 1060003840})
    assert cell.startswith('<span class="mem" title="1060003840 bytes">1011 MiB</span>')
    assert "+66.8 MiB over 944 MiB at start" in cell and "method=rss_vmhwm" in cell
    assert "peak_bytes=" not in cell
    # any *_bytes figure of a key-value table is shown in units too, the exact count in its tooltip
    assert '<span title="5419008 bytes">5.17 MiB</span>' in kv_table({"recorded_bytes": 5419008})


def test_sentences_one_per_line_and_in_the_rebuilt_command(db, build, tmp_path):
    b = build(db, bug_layer=None, engine_results=False, record=False,
              config={"input_text": HOSTILE, "dtype": "float32", "layers": [0, 2]})
    page = render_html(ValidationReport.from_session(b.session_id, db))
    ol = re.search(r'<ol id="input-sentences"[^>]*>(.*?)</ol>', page, re.S)
    assert ol is not None
    items = re.findall(r"<li>(.*?)</li>", ol.group(1), re.S)
    assert [html.unescape(i) for i in items] == [neutralise_bidi(s) for s in HOSTILE]
    cmd = html.unescape(re.search(r'<pre id="command">(.*?)</pre>', page, re.S).group(1))
    assert not set(BIDI) & set(cmd) and "\n" not in cmd  # one line, nothing hidden
    assert "--layers 0:2" in cmd
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is needed to check the quoting")
    # the shell reads back exactly the stored sentences (and runs none of them)
    argv = cmd.split(" ", 3)
    assert argv[:3] == ["python", "-m", "debug_framework.cli.debug_validate"]
    out = subprocess.run([bash, "-c", "printf '%s\\0' " + argv[3]], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.split("\0")[:-1]
    texts = [out[i + 1] for i, a in enumerate(out) if a == "--text"]
    assert texts == HOSTILE and not (tmp_path / "pwned").exists()


def test_shell_quote_forms():
    assert shell_quote("plain") == "plain"
    assert shell_quote("it's") == "'it'\"'\"'s'"
    assert shell_quote("a\nb") == "$'a\\nb'"
    assert shell_quote("x\u202ey") == "$'x\\u202ey'"
    session = SessionRecord("s", model_path="/m", config={"input_text": "one, two"})
    assert reproduce_command(session, ValidationResult.from_stored({}, []))[0].endswith("--text 'one, two'")


def test_long_strings_wrap_in_their_cell():
    digest = "f" * 64
    assert f'<span class="wrap">{digest}</span>' in kv_table({"weights digest": digest})
    assert "<td>short</td>" in kv_table({"k": "short"})


def test_bidi_controls_are_neutralised_in_the_page(db, build):
    assert esc("a\u202eb") == "a&lt;U+202E&gt;b"
    assert neutralise_bidi(BIDI) == "".join(f"<U+{ord(c):04X}>" for c in BIDI)
    b = build(db, bug_layer=1, model_path=f"/m/evil{BIDI}.safetensors", config={"input_text": [f"x{BIDI}y"]},
              extra_results={"note": f"n{BIDI}"})
    page = render_html(ValidationReport.from_session(b.session_id, db))
    assert not set(BIDI) & set(page)
    assert "/m/evil&lt;U+202A&gt;" in page


def test_rebuilt_command_restates_the_thresholds_set_by_rtol_atol():
    session = SessionRecord("s", model_path="/m", tolerances={"governing_dtype": "bfloat16", "per_checkpoint": {}},
                            config={"precision_thresholds": {"rtol": 0.016, "atol": 1e-05}})
    assert "--rtol 0.016 --atol 1e-05" in reproduce_command(session, ValidationResult.from_stored({}, []))[0]


def test_diff_chart_draws_the_after_sessions_bound(db, build):
    from dataclasses import replace

    from debug_framework.reports import render_diff
    from debug_framework.reports.documents import session_side
    from debug_framework.services.session_diff import diff_sessions

    before, after = build(db, bug_layer=None), build(db, bug_layer=3)
    diff = diff_sessions(before.session_id, after.session_id, db)
    side = session_side(after.session_id, db)
    assert len(side.checkpoint_results) == len(after.results)
    # rows judged with a margin (error / bound): the bound in max-abs units is error / margin
    rows = [dict(r, margin=0.5) for r in side.checkpoint_results]
    page = render_diff(diff, "html", before=session_side(before.session_id, db), after=replace(side, checkpoint_results=rows))
    chart = _chart(page, "diff")
    assert "after&#x27;s bound" in chart
    expected = rows[-1]["max_abs_error"] / 0.5
    assert re.search(rf"after&#x27;s bound at post_processing: {re.escape(f'{expected:.6g}')}", chart)
