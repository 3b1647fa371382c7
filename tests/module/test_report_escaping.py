"""The inductor-debug report escapes every user-provided string: a hostile model, kernel, op, constraint or
plot name (markup, quotes, ``&``) in a real run directory reaches the page as text, in element content
and in attribute values alike, and the page is built with the framework's toolkit (its stylesheet and CSP)."""

from __future__ import annotations

import html
import json
import re

from debug_framework.reports._html import BASE_CSS, CSP, png_rgb
from debug_module.artifacts import RunDirectory
from debug_module.reports import build_report, render_html

EVIL = "<script>alert('x\"&y')</script>"
ESCAPED = html.escape(EVIL, quote=True)


def _hostile_run(root):
    run = RunDirectory(root, backend="aot_mock_backend", info={"model": f"model{EVIL}"})
    violation = {"constraint": f"constraint{EVIL}", "graph": f"graph{EVIL}", "node": f"node{EVIL}", "op": f"aten.{EVIL}",
                 "shape": [3, 12], "dtype": "float32", "message": f"message{EVIL}",
                 "source": {"file": f"file{EVIL}.py", "line": 7, "function": f"fn{EVIL}", "code": f"code{EVIL}"}}
    run.write_json("reports/constraints_000.json", {"graph": f"graph{EVIL}", "violations": [violation],
                                                    "violation_count": 1,
                                                    "coverage": {"nodes": 4, "fallback_ops": {f"op{EVIL}": 2}}},
                   kind="constraint_report")
    run.write_json("reports/guards.json", {"calls": 1, "graph_count": 2, "graph_break_count": 1,
                                           "graph_breaks": [{"graph_index": 0, "reason": f"reason{EVIL}",
                                                             "file": f"f{EVIL}", "line": 3, "code": f"c{EVIL}"}],
                                           "recompilations": [{"call_index": 1, "code_name": f"kernel{EVIL}",
                                                               "reasons": [f"why{EVIL}"]}]},
                   kind="guard_report")
    tensor = {"kind": "output", "name": f"kernel{EVIL}", "passed": False, "max_abs_error": 0.1,
              "reason": f"note{EVIL}"}
    run.write_json("reports/kerneldiff.json", {"model_name": f"model{EVIL}", "passed": False, "test_backend": f"be{EVIL}",
                                               "reference_backend": "eager", "mode": "tolerance", "runs": 1,
                                               "first_divergent_module": f"mod{EVIL}", "outputs": [tensor],
                                               "gradients": [], "modules": [], "missing": [f"miss{EVIL}"], "extra": [],
                                               "timing": {"test": {"backend": f"be{EVIL}", "first_call_s": 0.5}},
                                               "minifier": {"status": "verified", "repro": f"/tmp/r{EVIL}",
                                                            "detail": f"d{EVIL}"}},
                   kind="kerneldiff_report")
    plot = f"visualizations/plot{EVIL.replace('/', '_')}.png"
    (run.path / plot).parent.mkdir(exist_ok=True)
    (run.path / plot).write_bytes(png_rgb([[[0, 0, 0]]]))
    run.record(plot, "kerneldiff_plot")
    run.set_status("complete")
    return run


def test_hostile_names_are_escaped_in_the_debug_module_report(tmp_path):
    _hostile_run(tmp_path / "art")
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "b.json").write_text(json.dumps({
        "schema": "debug_module.benchmark/1", "name": f"bench{EVIL}", "model": f"m{EVIL}", "notes": f"n{EVIL}",
        "results": [{"backend": f"be{EVIL}", "latency_ms": {"mean": 1.0}}]}))
    data = build_report(tmp_path / "art", benchmarks_dir=bench)
    page = render_html(data, figures=False)

    assert "<script" not in page and "alert('" not in page
    for prefix in ("model", "constraint", "graph", "node", "aten.", "message", "fn", "code", "op", "reason",
                   "kernel", "why", "note", "mod", "miss", "be", "d", "bench", "m", "n"):
        assert f"{prefix}{ESCAPED}" in page, prefix
    # in attribute values too: the plot's alt text and the repro link
    assert re.search(r'<img class="plot" alt="plot&lt;script&gt;alert\(&#x27;x&quot;&amp;y&#x27;\)&lt;_script&gt;\.png"', page)
    assert f'href="file:///tmp/r{ESCAPED}"' in page
    # one page style and policy with the framework's reports
    assert BASE_CSS in page and f'content="{html.escape(CSP)}"' in page


def test_report_keeps_its_sections_and_figures(tmp_path):
    run = _hostile_run(tmp_path / "art")
    page = render_html(build_report(tmp_path / "art"), figures=False)
    for sid in ("summary", "constraints", "coverage", "guards", "kerneldiff", "benchmarks", "repros"):
        assert page.count(f'<section id="{sid}">') == 1, sid
    assert f'<h3 id="run-{run.run_id}">' in page and f'<h3 id="guards-{run.run_id}">' in page
    assert "1 call(s), 2 graph(s), 1 graph break(s), 1 recompilation(s)." in page
    assert "No benchmark results." in page and "No repros written." in page
    assert page.count('<img class="plot"') == 1 and "data:image/png;base64," in page
    assert re.search(r"<td>0.5</td>", page)  # the test side's first call, formatted


def test_toolkit_builders_escape_text_and_attributes_and_keep_their_own_markup():
    from debug_framework.reports._html import Markup, join, table, tag, td, trusted

    link = tag("a", EVIL, href=f"#run-{EVIL}", class_="run", hidden=False, open=True)
    assert link == f'<a href="#run-{ESCAPED}" class="run" open>{ESCAPED}</a>' and isinstance(link, Markup)
    assert tag("img", "ignored", alt=EVIL) == f'<img alt="{ESCAPED}">'  # a void element has no content
    assert tag("p", trusted("<b>ok</b>"), EVIL) == f"<p><b>ok</b>{ESCAPED}</p>"
    assert join([EVIL, tag("br")], sep="&") == f"{ESCAPED}&amp;<br>"
    grid = table([EVIL], [[EVIL, td("x", cls="v-fail")]], cls="violations", scroll=False)
    assert grid == (f'<table class="violations"><tr><th>{ESCAPED}</th></tr>'
                    f'<tr><td>{ESCAPED}</td><td class="v-fail">x</td></tr></table>')
    # a plain str that looks like markup is still text: only the builders' Markup is trusted
    assert tag("td", "<b>x</b>") == "<td>&lt;b&gt;x&lt;/b&gt;</td>"
