"""The dashboard's ``debug_module`` page: run directories under the dashboard's artifacts root.

Registered in the entry-point group ``debug_framework.dashboard_pages`` (pyproject.toml), so the
dashboard (in ``debug_framework``, which never imports this package) shows it when installed. It
reads each run through :func:`debug_module.reports.generator.collect_run`, the same data the
``inductor-debug`` report shows: graphs and statistics, constraint violations with their source
lines, guards and graph breaks, KernelDiff results and plots, minifier repros. Everything read from
a run is shown as text or data (never as Markdown or HTML), and files are opened only inside the
run's directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from debug_framework.jsonio import JsonObject, JsonValue

if TYPE_CHECKING:
    from types import ModuleType

    import pandas as pd

    from debug_framework.dashboard.extensions import PageContext

__all__ = ["runs_page", "kerneldiff_tables"]

_MAX_REPRO_CHARS = 20_000


def _inside(run: Path, relative: str) -> Path | None:
    """``run/relative`` when it is a regular file inside ``run`` (no ``..`` or link out of it)."""
    path = (run / relative).resolve()
    root = run.resolve()
    return path if path.is_file() and path.is_relative_to(root) else None


def _statistics(run: Path) -> list[tuple[str, JsonValue]]:
    """The run's graph statistics files (kind ``statistics`` in its manifest), read as JSON."""
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    out = []
    for f in manifest.get("files", []):
        path = _inside(run, str(f.get("path", ""))) if f.get("kind") == "statistics" else None
        if path is not None:
            out.append((str(f["path"]), json.loads(path.read_text(encoding="utf-8"))))
    return out


def _violations_frame(violations: list[JsonObject]) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for v in violations:
        src = v.get("source") or {}
        rows.append({"constraint": v.get("constraint"), "message": v.get("message"), "graph": v.get("graph"),
                     "node": v.get("node"), "op": v.get("op"), "shape": str(v.get("shape") or ""),
                     "dtype": v.get("dtype"),
                     "source": f"{src.get('file')}:{src.get('line')}" if src else "",
                     "code": src.get("code") if src else ""})
    return pd.DataFrame(rows)


def _num(value: JsonValue | None) -> str:
    """A metric as the tables show it: ``1.234e-05``, or ``-`` where not measured."""
    return f"{value:.3e}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _verdict(value: JsonValue | None) -> str:
    """``pass``, ``FAIL``, or ``-`` where there is no verdict."""
    return "pass" if value is True else "FAIL" if value is False else "-"


def kerneldiff_tables(kd: JsonObject) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A KernelDiff report (``reports/kerneldiff.json``) as two tables: the run (verdict, backends,
    mode, runs, first divergent module) as field/value rows, and one row per compared tensor
    (outputs, gradients, submodule outputs) with its verdict, rule, errors and reason."""
    import pandas as pd

    summary = [("verdict", _verdict(kd.get("passed"))),
               ("reference", str(kd.get("reference_backend") or "-")), ("backend", str(kd.get("test_backend") or "-")),
               ("mode", str(kd.get("mode") or "-")), ("runs", str(kd.get("runs") or "-")),
               ("first divergent module", str(kd.get("first_divergent_module") or "-")),
               ("exact match", _verdict(kd.get("exact_match")))]
    rows = []
    for kind in ("outputs", "gradients", "modules"):
        entries = kd.get(kind)
        for d in entries if isinstance(entries, list) else []:
            if isinstance(d, dict):
                rows.append({"kind": kind[:-1], "tensor": str(d.get("name") or ""),
                             "verdict": _verdict(d.get("passed")),
                             "rule": str(d.get("rule") or ""), "max abs": _num(d.get("max_abs_error")),
                             "RMSE": _num(d.get("rmse")), "ratio": _num(d.get("ratio")),
                             "reason": str(d.get("reason") or "")})
    columns = ["kind", "tensor", "verdict", "rule", "max abs", "RMSE", "ratio", "reason"]
    return pd.DataFrame(summary, columns=["field", "value"]), pd.DataFrame(rows, columns=columns)


def _show_run(st: ModuleType, run: Path) -> None:
    import pandas as pd

    from debug_framework.dashboard.data import cells, literal, plain

    from .reports.generator import collect_run

    data = collect_run(run)
    c = st.columns(4)
    c[0].metric("status", literal(data.get("status")))
    c[1].metric("graphs", len(data["graphs"]))
    c[2].metric("violations", len(data["violations"]))
    c[3].metric("repros", len(data["repros"]))
    st.text(plain(f"model: {data['model']}\nbackend: {data.get('backend')}  torch: {data.get('torch')}  "
                  f"created: {data.get('created')}"))
    st.subheader("Graphs and statistics")
    if data["graphs"]:
        st.dataframe(cells(pd.DataFrame(data["graphs"]).astype(str)), hide_index=True, width="stretch")
    st.dataframe(cells(pd.DataFrame([{"kind": k, "files": n} for k, n in data["files_by_kind"].items()])),
                 hide_index=True)
    if data["coverage"]:
        st.dataframe(cells(pd.DataFrame(data["coverage"]).astype(str)), hide_index=True, width="stretch")
    for rel, stats in _statistics(run):
        st.caption(literal(f"statistics of {rel}"))
        st.json(stats, expanded=False)
    st.subheader("Constraint violations")
    if data["violations"]:
        st.dataframe(cells(_violations_frame(data["violations"])), hide_index=True, width="stretch")
    else:
        st.caption("No constraint violations recorded.")
    st.subheader("Guards and graph breaks")
    guards = data.get("guards") or {}
    if guards:
        for key in ("graph_breaks", "recompilations"):
            items = guards.get(key) or []
            st.caption(f"{key.replace('_', ' ')}: {len(items)}")
            if items:
                st.dataframe(cells(pd.DataFrame(items).astype(str)), hide_index=True, width="stretch")
    else:
        st.caption("No guard report: `inductor-debug analyze --type guards --model module:factory` records one "
                   "(reports/guards.json).")
    st.subheader("KernelDiff")
    if data.get("kerneldiff"):
        kd = data["kerneldiff"]
        (st.success if kd.get("passed") else st.error)("KernelDiff " + ("passed" if kd.get("passed") else "failed"))
        summary, tensors = kerneldiff_tables(kd)
        st.dataframe(cells(summary), hide_index=True)
        st.dataframe(cells(tensors), hide_index=True, width="stretch")
        with st.expander("the report as JSON (reports/kerneldiff.json)"):
            st.json(kd, expanded=True)
        for plot in data["plots"]:
            path = _inside(run, plot)
            if path is not None and path.suffix.lower() == ".png":
                st.image(str(path), caption=literal(plot))  # captions are Markdown
    else:
        st.caption("No KernelDiff report in this run.")
    st.subheader("Minifier repros")
    for repro in data["repros"]:
        script = _inside(run, str(Path(repro) / "repro.py")) if Path(repro).is_relative_to(run.resolve()) else None
        st.text(plain(repro))
        if script is not None:
            st.code(script.read_text(encoding="utf-8", errors="replace")[:_MAX_REPRO_CHARS], language="python")


def runs_under(root: Path, find: Callable[[Path], Iterable[str | Path]]) -> list[Path]:
    """The run directories under ``root`` and under every ``runs`` folder one or two levels below it
    (``debug_artifacts/tour/runs``: where the tour writes its runs), each once."""
    roots = [root, *sorted(p for pattern in ("runs", "*/runs") for p in root.glob(pattern) if p.is_dir())]
    seen: dict[Path, None] = {}
    for r in roots:
        for run in find(r):
            seen.setdefault(Path(run) if Path(run).is_absolute() else r / run, None)
    return list(seen)


def runs_page(context: PageContext) -> None:
    """Draw the page (``context``: the dashboard's ``PageContext``: ``database``, ``artifacts``)."""
    import streamlit as st

    from debug_framework.dashboard.data import literal, plain

    from .reports.generator import find_runs, run_order

    root = Path(context.artifacts)
    st.caption(literal(f"Run directories under {root}"))
    runs = runs_under(root, find_runs)
    if not runs:
        st.info("No debug_module runs here. Start the dashboard with --artifacts DIR (`inductor-debug diff` and "
                "`inductor-debug analyze` write runs under ./debug_artifacts by default, the tour under ./debug_artifacts/tour/runs).")
        return
    by_name = {str(p.relative_to(root)): p for p in runs}
    # newest first: by when each was created (a run id names only its second, then a random suffix)
    pick = st.selectbox("run", sorted(by_name, key=lambda n: run_order(by_name[n]), reverse=True))
    if pick:
        try:
            _show_run(st, by_name[pick])
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged run directory
            st.error("This run directory could not be read.")
            st.text(plain(f"{type(exc).__name__}: {exc}"))


runs_page.title = "debug_module runs"  # type: ignore[attr-defined]
