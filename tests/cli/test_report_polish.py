"""The inductor-debug report as a reader sees it (issue 17): the framework's CSP, a run column on
violations from several runs, an exact-match KernelDiff in one line without plots, integer ticks on
count axes, bidi controls neutralised."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from debug_framework.reports import CSP
from debug_module.reports import build_report, render_html
from debug_module.reports._kerneldiff import exact_match_of
from debug_module.reports.generator import summary_figure

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def test_csp_meta_tag_is_the_frameworks(report_root):
    page = render_html(build_report(report_root["root"]), figures=False)
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert csp is not None and html.unescape(csp.group(1)) == CSP
    assert "<script" not in page  # nothing the policy would block
    assert not re.search(r"\son[a-z]+=", page)


def test_violations_from_several_runs_carry_a_run_column(report_root, artifacts_root):
    page = render_html(build_report(report_root["root"]), figures=False)
    tables = re.findall(r'<table class="violations">(.*?)</table>', page, re.S)
    assert tables and all("<th>run</th>" in t for t in tables)
    runs = set(re.findall(r'<td class="run"><a href="#guards-([^"]+)">', page))
    assert runs == {report_root["aot_run"], report_root["aot_run2"]}
    # one run only: no run column (it would repeat one value)
    single = render_html(build_report(artifacts_root["root"]), figures=False)
    assert '<td class="run">' not in single and "<th>graph</th>" in single


def test_exact_match_kerneldiff_is_one_line_without_plots(report_root):
    kd = report_root["exact"]
    assert kd.exact_match and kd.to_dict()["exact_match"] is True
    assert kd.visualizations == [] and "exact match: all" in kd.summary()
    run = Path(report_root["root"]) / report_root["exact_run"]
    assert not list(run.glob("visualizations/*.png"))
    data = build_report(report_root["root"])
    page = render_html(data, figures=False)
    section = page[page.index(f'id="run-{report_root["exact_run"]}"'):]
    section = section[:section.index("<h3", 10)] if "<h3" in section[10:] else section
    assert "Exact match: all 3 compared tensors are bit-identical" in section
    assert "<img" not in section
    # the failing KernelDiff still has its plots
    failing = page[page.index(f'id="run-{report_root["kd_run"]}"'):]
    assert failing.count('<img class="plot"') >= 2


def test_exact_match_of_saved_results():
    zero = {"max_abs_error": 0.0, "nan_count_reference": 0, "nan_count_test": 0}
    assert exact_match_of({"outputs": [zero], "modules": [zero]})
    assert not exact_match_of({"outputs": [zero, {**zero, "max_abs_error": 1e-7}]})
    assert not exact_match_of({"outputs": [{**zero, "nan_count_test": 1}]})
    assert not exact_match_of({"outputs": [zero], "missing": ["y"]})
    assert not exact_match_of({"outputs": []})


def test_old_kerneldiff_json_without_the_field_is_judged_on_read(report_root, tmp_path):
    import shutil

    root = tmp_path / "art"
    shutil.copytree(Path(report_root["root"]) / report_root["exact_run"], root / report_root["exact_run"])
    path = root / report_root["exact_run"] / "reports" / "kerneldiff.json"
    doc = json.loads(path.read_text())
    del doc["exact_match"]
    path.write_text(json.dumps(doc))
    assert build_report(root)["runs"][0]["kerneldiff"]["exact_match"] is True


def test_count_axes_have_integer_ticks(report_root):
    fig = summary_figure(build_report(report_root["root"]))
    violations, kerneldiff = fig.axes
    for ticks in (violations.get_xticks(), kerneldiff.get_yticks()):
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_bidi_controls_are_neutralised(report_root):
    data = build_report(report_root["root"])
    data["runs"][0]["model"] = f"evil{BIDI}name"
    data["violations_by_model"] = {f"m{BIDI}": {"c": [{"graph": f"g{BIDI}", "run_id": "r", "message": BIDI}]}}
    page = render_html(data, figures=False)
    assert not set(BIDI) & set(page)
    assert "evil&lt;U+202A&gt;&lt;U+202B&gt;" in page


def test_bidi_in_terminal_summary_and_in_markup():
    from debug_framework.reports._html import tag, trusted
    from debug_module.diff.report import DiffReport

    text = DiffReport(model_name=f"net{BIDI}", run_id="r", created="", reference_backend="eager",
                      test_backend="inductor", mode="tolerance", runs=1).summary()
    assert not set(BIDI) & set(text) and "net<U+202A>" in text
    # the toolkit escapes text children and attribute values alike; markup it built is kept as is
    assert tag("b", "x\u202ey", title="t\u202e") == '<b title="t&lt;U+202E&gt;">x&lt;U+202E&gt;y</b>'
    assert tag("p", trusted("<b>x</b>"), 3) == "<p><b>x</b>3</p>"
