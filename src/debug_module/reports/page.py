"""The inductor-debug report page: the report's data (:func:`~debug_module.reports.build_report`) as one
self-contained HTML page, built with the project's one HTML toolkit (``debug_framework.reports._html``).

Every value read from the runs (model, kernel, op and constraint names, messages, source lines, paths)
reaches the page through the toolkit's builders, which escape whatever is not markup they built; the
page has the framework reports' stylesheet and Content-Security-Policy, and no script.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from debug_framework.jsonio import JsonObject, JsonValue
from debug_framework.reports._html import Markup, cards, join, page, png_bytes_data_uri, section, table, tag, td

__all__ = ["render_page", "fmt_value"]

_MAX_PLOT_BYTES = 4 << 20
_SECTIONS = (("summary", "summary"), ("constraints", "constraint violations"), ("coverage", "coverage"),
             ("guards", "graph breaks"), ("kerneldiff", "KernelDiff"), ("benchmarks", "benchmarks"),
             ("repros", "repros"))


def fmt_value(v: object) -> str:
    """A number as the report shows it: None as ``n/a``, small or large floats in ``%.3e``, others ``%.4g``."""
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3e}" if (v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4)) else f"{v:.4g}"
    return str(v)


def _obj(value: JsonValue | object) -> JsonObject:
    """``value`` when it is a JSON object, else an empty one (a field missing from an older run)."""
    return value if isinstance(value, dict) else {}


def _items(value: JsonValue | object) -> list[JsonObject]:
    """The JSON objects in ``value`` when it is a list (anything else: none)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _count(value: JsonValue | object) -> int:
    """How many items a list or object holds (0 for anything else)."""
    return len(value) if isinstance(value, list | dict) else 0


def _text(value: JsonValue | object) -> str:
    """A field as text: missing (None) as empty."""
    return "" if value is None else str(value)


def _verdict(passed: object) -> Markup:
    return tag("span", "PASS" if passed else "FAIL", class_="v-pass" if passed else "v-fail")


def _verdict_cell(passed: object) -> Markup:
    return td("PASS" if passed else "FAIL", cls="v-pass" if passed else "v-fail")


def _where(file: object, line: object, code: object, function: object = None) -> Markup:
    """A source location: ``file:line`` (in ``function``) and its code line."""
    parts: list[object] = [tag("code", f"{_text(file)}:{_text(line)}", class_="wrap")]
    if function is not None:
        parts.append(f" in {function}")
    parts.append(tag("pre", _text(code)))
    return join(parts)


def _file_link(path: object) -> Markup:
    return tag("a", _text(path), href=f"file://{_text(path)}")


# ---------------------------------------------------------------------------------------------- sections


def _summary(data: JsonObject, figure: str | None) -> Markup:
    s = _obj(data.get("summary"))
    figures = cards([(s.get("runs"), "runs"), (_count(s.get("models")), "models"), (s.get("artifacts"), "artifacts"),
                     (s.get("graphs"), "ATen graphs"), (s.get("violations"), "constraint violations"),
                     (s.get("graph_breaks"), "graph breaks"), (s.get("recompilations"), "recompilations"),
                     (f"{_text(s.get('kerneldiff_passed'))}/{_text(s.get('kerneldiff_total'))}", "KernelDiff passed"),
                     (s.get("repros"), "repros")])
    runs = [[tag("a", _text(r.get("run_id")), href=f"#run-{_text(r.get('run_id'))}"), r.get("model"), r.get("backend"),
             r.get("status"), r.get("created"), r.get("file_count"), _count(r.get("graphs")), _count(r.get("violations"))]
            for r in _items(data.get("runs"))]
    return section("summary", "Summary", figures,
                   tag("img", class_="plot", alt="summary figure", src=figure) if figure else "",
                   table(["run", "model", "backend", "status", "created", "files", "graphs", "violations"], runs))


def _violation_row(v: JsonObject, multi_run: bool) -> list[object]:
    src = v.get("source")
    where = (_where(src.get("file"), src.get("line"), src.get("code"), src.get("function")) if isinstance(src, dict) and src
             else tag("span", "unknown", class_="muted"))
    run = [td(tag("a", _text(v.get("run_id")), href=f"#guards-{_text(v.get('run_id'))}"), cls="run")] if multi_run else []
    return [*run, v.get("graph"), v.get("node"), tag("code", _text(v.get("op"))), v.get("shape"), v.get("dtype"),
            v.get("message"), where]


def _constraints(data: JsonObject) -> Markup:
    by_model = _obj(data.get("violations_by_model"))
    multi_run = len({v.get("run_id") for by_c in by_model.values() for vs in _obj(by_c).values()
                     for v in _items(vs)}) > 1
    headers = (["run"] if multi_run else []) + ["graph", "node", "op", "shape", "dtype", "message", "source"]
    parts: list[object] = [] if by_model else [tag("p", "No constraint violations recorded.")]
    for model, by_constraint in by_model.items():
        parts.append(tag("h3", model))
        for constraint, vs in _obj(by_constraint).items():
            items = _items(vs)
            parts.append(tag("details", tag("summary", tag("b", constraint), f" - {len(items)} violation(s)"),
                             table(headers, (_violation_row(v, multi_run) for v in items), cls="violations"), open=True))
    return section("constraints", "Constraint violations", *parts)


def _fallback_ops(ops: JsonValue) -> Markup:
    return join((join([tag("code", op), f" x{_text(n)}"]) for op, n in _obj(ops).items()), ", ")


def _coverage(data: JsonObject) -> Markup:
    rows = [[r.get("run_id"), c.get("graph"), c.get("nodes"), c.get("supported_nodes"), fmt_value(c.get("node_share")),
             c.get("ops"), fmt_value(c.get("op_share")), c.get("partitions"), _fallback_ops(c.get("fallback_ops"))]
            for r in _items(data.get("runs")) for c in _items(r.get("coverage"))]
    return section("coverage", "Coverage", table(["run", "graph", "nodes", "supported nodes", "node share", "ops",
                                                  "op share", "partitions", "fallback ops"], rows))


def _guards_of(run: JsonObject) -> list[object]:
    g = _obj(run.get("guards"))
    if not run.get("guards"):
        return [tag("p", f"No guard report in this run ({_text(run.get('fx_graph_count'))} Dynamo graph(s) captured); ",
                    tag("code", "inductor-debug analyze --type guards --model module:factory"), " records one.",
                    class_="muted")]
    recompilations = _items(g.get("recompilations"))
    out: list[object] = [tag("p", f"{_text(g.get('calls'))} call(s), {_text(g.get('graph_count'))} graph(s), "
                                  f"{_text(g.get('graph_break_count'))} graph break(s), "
                                  f"{len(recompilations)} recompilation(s).")]
    breaks = _items(g.get("graph_breaks"))
    if breaks:
        out.append(table(["graph", "reason", "where"], [[b.get("graph_index"), b.get("reason"),
                                                         _where(b.get("file"), b.get("line"), b.get("code"))]
                                                        for b in breaks]))
    if recompilations:
        reasons = (join(join([why, tag("br")]) for why in (rc.get("reasons") or [])) for rc in recompilations)
        out.append(table(["call", "code", "reasons"], [[rc.get("call_index"), rc.get("code_name"), why]
                                                       for rc, why in zip(recompilations, reasons)]))
    return out


def _guards(data: JsonObject) -> Markup:
    parts: list[object] = []
    for r in _items(data.get("runs")):
        parts.append(tag("h3", _text(r.get("model")), " ", tag("span", f"({_text(r.get('run_id'))})", class_="muted"),
                         id=f"guards-{_text(r.get('run_id'))}"))
        parts.extend(_guards_of(r))
    return section("guards", "Graph breaks and recompilations", *parts)


_TENSOR_HEADERS = ["kind", "tensor", "verdict", "max abs", "mean abs", "max rel", "rmse", "mismatch %", "NaN ref/test",
                   "Inf ref/test", "runs mean / std", "note"]
_TIMING_HEADERS = ["side", "backend", "first call (s)", "backend compile (s)", "graphs", "steady median (s)",
                   "steady mean +- std (s)"]


def _tensor_row(d: JsonObject) -> list[object]:
    return [d.get("kind"), tag("code", _text(d.get("name"))), _verdict_cell(d.get("passed")),
            *(fmt_value(d.get(k)) for k in ("max_abs_error", "mean_abs_error", "max_rel_error", "rmse", "mismatch_percent")),
            f"{_text(d.get('nan_count_reference'))}/{_text(d.get('nan_count_test'))}",
            f"{_text(d.get('inf_count_reference'))}/{_text(d.get('inf_count_test'))}",
            f"{fmt_value(d.get('error_mean'))} / {fmt_value(d.get('error_std'))}", d.get("reason") or ""]


def _timing_rows(timing: JsonObject) -> list[list[object]]:
    rows: list[list[object]] = []
    for side in ("reference", "eager_float32", "test"):
        t = _obj(timing.get(side))
        if t:
            steady = _obj(t.get("steady_state_s"))
            rows.append([side, t.get("backend"), fmt_value(t.get("first_call_s")), fmt_value(t.get("backend_compile_s")),
                         t.get("graphs_compiled"), fmt_value(steady.get("median")),
                         f"{fmt_value(steady.get('mean'))} +- {fmt_value(steady.get('std'))}"])
    return rows


def _minifier(m: JsonObject) -> Markup:
    return tag("p", f"Minifier: {_text(m.get('status'))}",
               join([" - repro: ", _file_link(m.get("repro"))]) if m.get("repro") else "",
               join([" ", tag("span", f"({_text(m.get('detail'))})", class_="muted")]) if m.get("detail") else "")


def _plots(run: JsonObject, exact: bool) -> list[Markup]:
    """The run's KernelDiff plots as embedded figures (none for an exact match: they would be all zeros)."""
    out = []
    for rel in [] if exact else run.get("plots") or []:
        try:
            data = (Path(_text(run.get("path"))) / str(rel)).read_bytes()
        except OSError:
            continue
        if len(data) <= _MAX_PLOT_BYTES and data.startswith(b"\x89PNG"):
            name = Path(str(rel)).name
            out.append(tag("figure", tag("img", class_="plot", alt=name, src=png_bytes_data_uri(data)),
                           tag("figcaption", name, class_="muted")))
    return out


def _kerneldiff_of(run: JsonObject) -> list[object]:
    k = _obj(run.get("kerneldiff"))
    tensors = [d for key in ("outputs", "gradients", "modules") for d in _items(k.get(key))]
    exact = bool(k.get("exact_match"))
    out: list[object] = [tag("h3", f"{_text(k.get('model_name'))}: ", _verdict(k.get("passed")), " ",
                             tag("span", f"({_text(k.get('test_backend'))} vs {_text(k.get('reference_backend'))}, "
                                         f"{_text(k.get('mode'))}, {_text(k.get('runs'))} run(s))", class_="muted"),
                             id=f"run-{_text(run.get('run_id'))}")]
    if k.get("first_divergent_module"):
        out.append(tag("p", "First divergent module: ", tag("b", tag("code", _text(k.get("first_divergent_module"))))))
    grid = table(_TENSOR_HEADERS, (_tensor_row(d) for d in tensors))
    if exact:
        out.append(tag("p", f"Exact match: all {len(tensors)} compared tensors are bit-identical (no error plots).",
                       class_="exact v-pass"))
        grid = tag("details", tag("summary", f"the {len(tensors)} tensors"), grid)
    out.append(grid)
    if k.get("missing") or k.get("extra"):
        out.append(tag("p", f"Missing on test side: {', '.join(map(str, k.get('missing') or []))}; "
                            f"extra: {', '.join(map(str, k.get('extra') or []))}", class_="v-fail"))
    out.append(table(_TIMING_HEADERS, _timing_rows(_obj(k.get("timing")))))
    if k.get("minifier"):
        out.append(_minifier(_obj(k.get("minifier"))))
    out.extend(_plots(run, exact))
    return out


def _kerneldiff(data: JsonObject) -> Markup:
    runs = [r for r in _items(data.get("runs")) if r.get("kerneldiff")]
    parts: list[object] = [] if runs else [tag("p", "No KernelDiff results.")]
    for r in runs:
        parts.extend(_kerneldiff_of(r))
    return section("kerneldiff", "KernelDiff", *parts)


_BENCH_HEADERS = ["backend", "compile (s)", "first call (s)", "latency mean (ms)", "std (ms)", "median (ms)", "runs",
                  "speedup vs eager", "graphs", "breaks", "violations", "KernelDiff"]


def _bench_row(row: JsonObject) -> list[object]:
    lat = _obj(row.get("latency_ms"))
    speedup = row.get("speedup_vs_eager")
    return [row.get("backend"), fmt_value(row.get("compile_s")), fmt_value(row.get("first_call_s")),
            *(fmt_value(lat.get(k)) for k in ("mean", "std", "median", "runs")),
            f"{speedup:.2f}x" if isinstance(speedup, int | float) and speedup else "n/a",
            *(fmt_value(row.get(k)) for k in ("graph_count", "graph_breaks", "violations", "kerneldiff"))]


def _benchmarks(data: JsonObject) -> Markup:
    benchmarks = _items(data.get("benchmarks"))
    parts: list[object] = [] if benchmarks else [tag("p", "No benchmark results.")]
    for b in benchmarks:
        where = " ".join([_text(b.get("model")), _text(b.get("device")), _text(b.get("created"))])
        parts += [tag("h3", _text(b.get("name") or b.get("file")), " ", tag("span", where, class_="muted")),
                  table(_BENCH_HEADERS, (_bench_row(r) for r in _items(b.get("results"))))]
        if b.get("notes"):
            parts.append(tag("p", _text(b.get("notes")), class_="muted"))
    parts += [tag("p", f"skipped {_text(sk.get('file'))}: {_text(sk.get('reason'))}", class_="muted")
              for sk in _items(data.get("benchmarks_skipped"))]
    return section("benchmarks", "Benchmarks", *parts)


def _repros(data: JsonObject) -> Markup:
    items = [tag("li", f"{_text(r.get('model'))}: ", _file_link(p))
             for r in _items(data.get("runs")) for p in (r.get("repros") or [])]
    return section("repros", "Repros", tag("ul", *items) if items else tag("p", "No repros written."))


def _nav(sections: Iterable[tuple[str, str]]) -> Markup:
    return tag("nav", *(tag("a", label, href=f"#{sid}") for sid, label in sections))


def render_page(data: Mapping[str, JsonValue], *, figure: str | None = None) -> str:
    """The report's data as one page: summary (with ``figure``, a PNG ``data:`` URI, when given),
    constraint violations by model and constraint, coverage, graph breaks and recompilations,
    KernelDiff results with their plots, benchmarks and repros."""
    doc: JsonObject = dict(data)
    s = _obj(doc.get("summary"))
    return page("inductor-debug report",
                tag("h1", "inductor-debug report"),
                tag("p", "Generated ", _text(doc.get("created")), " from ", tag("code", _text(doc.get("root"))),
                    f" - {_text(s.get('runs'))} run(s).", class_="muted"),
                _nav(_SECTIONS), _summary(doc, figure), _constraints(doc), _coverage(doc), _guards(doc),
                _kerneldiff(doc), _benchmarks(doc), _repros(doc))
