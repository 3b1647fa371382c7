"""The debug report: one self-contained HTML file (and its JSON twin) over one or more run directories.

    from debug_module.reports import build_report, write_report
    data = build_report("debug_artifacts")                      # every run under the root
    html_path, json_path = write_report(data, "report.html")    # plots embedded as base64 PNG

Sections: summary figures, constraint violations grouped by model and constraint (with source
lines), coverage per graph, graph breaks and recompilations (from ``reports/guards.json``),
KernelDiff results with their plots, benchmark tables (from benchmark JSON files, format
``debug_module.benchmark/1`` below), and links to repros.

Benchmark result files (any ``*.json`` in the benchmark directory; others are listed as skipped)::

    {"schema": "debug_module.benchmark/1",
     "name": "resnet18-cpu",                 # this benchmark's label
     "model": "ResNet-18",                   # model name
     "created": "2025-01-01T00:00:00+00:00", # ISO-8601
     "device": "cpu", "torch": "2.13.0",     # optional environment fields
     "results": [                            # one row per backend
        {"backend": "eager",                 # required
         "compile_s": null,                  # seconds to compile (null for eager)
         "first_call_s": 0.05,               # first call, compile included
         "latency_ms": {"mean": 41.6, "std": 1.2, "median": 41.0, "runs": 10},   # steady state (required)
         "graph_count": 1, "graph_breaks": 0, "recompilations": 0,
         "violations": 0,                    # constraint violations found
         "kerneldiff": "pass" | "fail" | null,
         "peak_memory_bytes": null}],
     "notes": "free text"}

Speedup is computed per file as ``eager mean latency / backend mean latency`` when an ``eager`` row exists.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from debug_framework.jsonio import JsonObject, JsonValue, dumps_json
from debug_framework.reports._html import png_bytes_data_uri

from ._kerneldiff import exact_match_of
from .page import render_page

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..artifacts import RunDirectory
    from ..guards import GuardReport

#: Same as debug_module.artifacts.MANIFEST_SCHEMA (not imported: reading runs must not need torch).
MANIFEST_SCHEMA = "debug_module.run/1"

__all__ = ["REPORT_SCHEMA", "BENCHMARK_SCHEMA", "find_runs", "run_order", "collect_run", "load_benchmarks", "build_report",
           "render_html", "write_report", "save_guard_report", "summary_figure"]

REPORT_SCHEMA = "debug_module.report/1"
BENCHMARK_SCHEMA = "debug_module.benchmark/1"


def _read_json(p: Path) -> JsonValue:
    """The JSON document in ``p``."""
    return json.loads(p.read_text(encoding="utf-8"))


def is_run_dir(p: Path) -> bool:
    """A directory created by debug_module: ``manifest.json`` with our schema and ``run_id`` equal to its name."""
    m = p / "manifest.json"
    if not p.is_dir() or not m.is_file():
        return False
    try:
        data = _read_json(m)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == MANIFEST_SCHEMA and data.get("run_id") == p.name


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run directories directly under ``root``, oldest first: by the manifest's ``created`` time
    (microseconds; run ids only carry the second, then a random suffix), then the id."""
    r = Path(root)
    if not r.is_dir():
        return []
    return sorted((p for p in r.iterdir() if is_run_dir(p)), key=run_order)


def run_order(run: Path) -> tuple[str, str]:
    """What orders runs oldest first: the manifest's ``created`` time (microseconds; run ids only
    carry the second, then a random suffix), then the id."""
    return _created(run), run.name


def _created(run: Path) -> str:
    """The manifest's ISO ``created`` stamp ("" when unreadable: such runs sort by id first)."""
    try:
        created = json.loads((run / "manifest.json").read_text(encoding="utf-8")).get("created")
    except (OSError, ValueError, AttributeError):
        return ""
    return created if isinstance(created, str) else ""


def save_guard_report(report: GuardReport, run_dir: RunDirectory | str | os.PathLike[str]) -> Path:
    """Store a :class:`~debug_module.guards.GuardReport` in a run directory (``reports/guards.json``,
    recorded in its manifest). ``run_dir``: a :class:`~debug_module.artifacts.RunDirectory` or a run's path."""
    from ..artifacts import RunDirectory

    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory.open(run_dir)
    return run.write_text("reports/guards.json", dumps_json(report.to_dict()) + "\n", kind="guard_report")


def collect_run(run_dir: str | os.PathLike[str]) -> JsonObject:
    """Everything the report and the CLI show about one run directory, as plain data."""
    path = Path(run_dir)
    manifest = _read_json(path / "manifest.json")
    files = manifest.get("files", [])
    kinds: dict[str, int] = defaultdict(int)
    for f in files:
        kinds[f.get("kind", "?")] += 1
    info = manifest.get("info", {}) or {}
    model = info.get("model") or f"{manifest.get('backend', 'run')} {manifest.get('run_id')}"
    violations: list[JsonValue] = []
    coverage: list[JsonValue] = []
    for f in files:
        if f.get("kind") == "constraint_report" and (path / f["path"]).is_file():
            rep = _read_json(path / f["path"])
            for v in rep.get("violations", []):
                violations.append({**v, "graph": v.get("graph") or rep.get("graph"), "model": model,
                                   "run_id": manifest.get("run_id")})
            coverage.append({"graph": rep.get("graph"), **rep.get("coverage", {}), "violations": rep.get("violation_count", 0)})
    guards = None
    if (path / "reports" / "guards.json").is_file():
        guards = _read_json(path / "reports" / "guards.json")
    kerneldiff = None
    if (path / "reports" / "kerneldiff.json").is_file():
        kerneldiff = _read_json(path / "reports" / "kerneldiff.json")
        if isinstance(kerneldiff, dict) and "exact_match" not in kerneldiff:  # saved before the field existed
            kerneldiff["exact_match"] = exact_match_of(kerneldiff)
    repros = sorted({str(Path(f["path"]).parts[1]) if len(Path(f["path"]).parts) > 2 else f["path"]
                     for f in files if f["path"].startswith("repros/")})
    if (path / "repros").is_dir():  # writers that do not record in the manifest
        repros = sorted(set(repros) | {p.name for p in (path / "repros").iterdir()})
    fx_graphs = [f["graph"] for f in files if f.get("kind") == "fx_graph"]
    return {
        "run_id": manifest.get("run_id"),
        "path": str(path.resolve()),
        "created": manifest.get("created"),
        "backend": manifest.get("backend"),
        "status": manifest.get("status"),
        "torch": manifest.get("torch"),
        "model": model,
        "info": info,
        "file_count": len(files),
        "files_by_kind": dict(sorted(kinds.items())),
        "fx_graph_count": len(fx_graphs),
        "graphs": manifest.get("graphs", []),
        "violations": violations,
        "coverage": coverage,
        "guards": guards,
        "kerneldiff": kerneldiff,
        "plots": [f["path"] for f in files if f.get("kind") == "kerneldiff_plot"],
        "repros": [str((path / "repros" / r).resolve()) if not r.startswith("repros/") else str((path / r).resolve())
                   for r in repros],
    }


def load_benchmarks(directory: str | os.PathLike[str] | None) -> tuple[list[JsonObject], list[dict[str, str]]]:
    """Benchmark result files (``debug_module.benchmark/1``) in ``directory``; (valid files, skipped files with why)."""
    if directory is None or not Path(directory).is_dir():
        return [], []
    good, skipped = [], []
    for p in sorted(Path(directory).glob("*.json")):
        try:
            data = _read_json(p)
        except (OSError, ValueError) as e:
            skipped.append({"file": p.name, "reason": f"not JSON: {e}"})
            continue
        if not isinstance(data, dict) or data.get("schema") != BENCHMARK_SCHEMA:
            skipped.append({"file": p.name, "reason": f"schema is not {BENCHMARK_SCHEMA!r}"})
            continue
        rows = data.get("results")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("backend"), str)
                                                 and isinstance(r.get("latency_ms"), dict) for r in rows):
            skipped.append({"file": p.name, "reason": "results must be a list of {backend, latency_ms: {mean, ...}, ...}"})
            continue
        eager = next((r for r in rows if r["backend"] == "eager"), None)
        for r in rows:
            mean = r["latency_ms"].get("mean")
            e_mean = eager["latency_ms"].get("mean") if eager else None
            r["speedup_vs_eager"] = (e_mean / mean) if isinstance(mean, int | float) and mean > 0 and isinstance(e_mean, int | float) else None
        good.append({**data, "file": p.name})
    return good, skipped


def build_report(root: str | os.PathLike[str], *, run_ids: list[str] | None = None,
                 benchmarks_dir: str | os.PathLike[str] | None = None) -> JsonObject:
    """The report's data (the JSON twin): selected runs (default: all under ``root``) and benchmarks
    (default directory: ``<root>/benchmarks``)."""
    runs = find_runs(root)
    if run_ids:
        wanted = set(run_ids)
        unknown = wanted - {p.name for p in runs}
        if unknown:
            raise FileNotFoundError(f"no run {', '.join(sorted(unknown))} under {root}")
        runs = [p for p in runs if p.name in wanted]
    collected = [collect_run(p) for p in runs]
    bdir = benchmarks_dir if benchmarks_dir is not None else Path(root) / "benchmarks"
    benchmarks, skipped = load_benchmarks(bdir)
    grouped: dict[str, dict[str, list[JsonObject]]] = defaultdict(lambda: defaultdict(list))
    for r in collected:
        for v in r["violations"]:
            grouped[v["model"]][v.get("constraint", "?")].append(v)
    kd = [r["kerneldiff"] | {"_run": r["run_id"]} for r in collected if r["kerneldiff"]]
    breaks = sum(len((r["guards"] or {}).get("graph_breaks", [])) for r in collected)
    recompiles = sum(len((r["guards"] or {}).get("recompilations", [])) for r in collected)
    summary = {
        "runs": len(collected),
        "models": sorted({r["model"] for r in collected}),
        "artifacts": sum(r["file_count"] for r in collected),
        "graphs": sum(len(r["graphs"]) for r in collected),
        "violations": sum(len(r["violations"]) for r in collected),
        "graph_breaks": breaks,
        "recompilations": recompiles,
        "kerneldiff_total": len(kd),
        "kerneldiff_passed": sum(1 for k in kd if k.get("passed")),
        "repros": sum(len(r["repros"]) for r in collected),
        "benchmarks": len(benchmarks),
    }
    summary["kerneldiff_pass_rate"] = (summary["kerneldiff_passed"] / len(kd)) if kd else None
    return {
        "schema": REPORT_SCHEMA,
        "created": _dt.datetime.now(_dt.UTC).isoformat(),
        "root": str(Path(root).resolve()),
        "summary": summary,
        "runs": collected,
        "violations_by_model": {m: dict(c) for m, c in grouped.items()},
        "benchmarks": benchmarks,
        "benchmarks_skipped": skipped,
    }


# ---------------------------------------------------------------------------------------------- HTML


def _summary_figure(data: JsonObject) -> str:
    """Bar charts: violations per constraint, and KernelDiff pass/fail (embedded PNG)."""
    fig = summary_figure(data)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return png_bytes_data_uri(buf.getvalue())


def summary_figure(data: JsonObject) -> Figure:
    """The summary's matplotlib figure: violations per constraint and KernelDiff pass/fail, both
    count axes with integer ticks only."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    per_constraint: dict[str, int] = defaultdict(int)
    for by_c in data["violations_by_model"].values():
        for c, vs in by_c.items():
            per_constraint[c] += len(vs)
    s = data["summary"]
    fig = Figure(figsize=(8, 3), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if per_constraint:
        names = sorted(per_constraint)
        ax1.barh(names, [per_constraint[n] for n in names], color="#e67e22")
        ax1.invert_yaxis()
    else:
        ax1.text(0.5, 0.5, "no violations", ha="center", va="center")
    ax1.set_title("constraint violations", fontsize=9)
    ax1.tick_params(labelsize=7)
    passed, total = s["kerneldiff_passed"], s["kerneldiff_total"]
    ax2.bar(["pass", "fail"], [passed, total - passed], color=["#27ae60", "#c0392b"])
    ax2.set_title(f"KernelDiff results ({total})", fontsize=9)
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def render_html(data: JsonObject, *, figures: bool = True) -> str:
    """The report as one self-contained HTML page (:mod:`.page`: the project's one HTML toolkit, every
    user-provided string escaped by construction); ``figures``: with the summary's bar charts."""
    return render_page(data, figure=_summary_figure(data) if figures else None)


def write_report(data: JsonObject, output: str | os.PathLike[str], *, fmt: str = "html") -> tuple[Path | None, Path]:
    """Write the HTML report and its JSON twin (same stem, ``.json``), or only the JSON for ``fmt="json"``.
    Returns (html path or None, json path)."""
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        json_path = out if out.suffix == ".json" else out.with_suffix(".json")
        json_path.write_text(dumps_json(data) + "\n", encoding="utf-8")
        return None, json_path
    html_path = out if out.suffix in (".html", ".htm") else out.with_suffix(".html")
    html_path.write_text(render_html(data), encoding="utf-8")
    json_path = html_path.with_suffix(".json")
    json_path.write_text(dumps_json(data) + "\n", encoding="utf-8")
    return html_path, json_path
