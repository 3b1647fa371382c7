"""``inductor-debug`` (also ``python -m debug_module``): list, analyze, diff, report, minify and clean runs.

Built on the project's CLI framework (:mod:`debug_framework.cli.framework`). Exit codes: 0 success;
1 numerical failure (a failing KernelDiff); 2 usage or environment error (a bad option, an unknown
run, an error raised by the user's model or by torch on it); 3 internal error (a bug of ours: one
line naming the crash log that holds the traceback).
``--json`` prints one JSON document (schema: ``debug_module/schemas/cli-output.schema.json``).
See docs/inductor-debug-cli.md.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from debug_framework.cli.framework import (EXIT_FAIL, EXIT_PASS, CliError, Failure, Invocation, JsonValue,
                                           make_app, make_console, print_json, raised_in, run_app)
from debug_framework.cli.tables import Column
from debug_framework.suggest import did_you_mean, one_of

from .cli_minify import MinifyOptions

#: Same as debug_module.artifacts.DEFAULT_ARTIFACT_ROOT (not imported: list/report/clean must start without torch).
DEFAULT_ARTIFACT_ROOT = "./debug_artifacts"

__all__ = ["app", "main", "CLI_SCHEMA", "CliError"]

CLI_SCHEMA = "inductor-debug/1"
ANALYSIS_TYPES = ("guards", "constraints", "graphs", "summary")
_LOWERINGS = ("eager", "inductor")
_REPORT_FORMATS = ("html", "json")
PROG = "inductor-debug"

#: What a command body returns: its JSON ``data``, its exit code, and the human output.
Outcome = tuple[dict[str, Any], int, Callable[[], None]]

app = make_app("Inspect torch.compile debug runs: list, analyze, diff, report, minify, clean.", group=True)


class _State(Invocation):
    """One ``inductor-debug`` run: the global ``--root``/``--json``, the command, the user's code.

    A failure raised by the user's model (its traceback passes through a file loaded by
    ``--model``/``--inputs``/``--backend``) or by torch on it is an environment error (exit 2);
    anything else not DF-coded is a bug of ours (exit 3).
    """

    def __init__(self) -> None:
        super().__init__(PROG)
        self.root = Path(DEFAULT_ARTIFACT_ROOT)
        self.command = "list"  # set by every command before it does work
        self.user_files: set[str] = set()

    def begin(self, command: str, root: Path | None, as_json: bool) -> _State:
        """A command's own ``--root``/``--json`` (after the command name) override the global ones."""
        self.command = command
        self.root = root if root is not None else self.root
        self.as_json = self.as_json or as_json
        return self

    def document(self, exit_code: int, data: dict[str, Any] | None, error: dict[str, Any] | None) -> JsonValue:
        """The ``inductor-debug/1`` document."""
        return {"schema": CLI_SCHEMA, "command": self.command, "ok": exit_code == EXIT_PASS, "exit_code": exit_code,
                "root": str(self.root), "data": data, "error": error}

    def error_document(self, failure: Failure) -> JsonValue:
        message = failure.message if failure.code is None else f"[{failure.code}] {failure.message}"
        hint = failure.hint
        if failure.kind == "internal":
            hint = f"a bug in {PROG}; the traceback is in {failure.log_file or 'no log file (see stderr)'}"
        return self.document(failure.exit_code, None, {"type": failure.kind, "message": message, "hint": hint})

    def is_environment_error(self, exc: BaseException) -> bool:
        return (super().is_environment_error(exc) or type(exc).__module__.split(".")[0] == "torch"
                or raised_in(exc, self.user_files))


# ---------------------------------------------------------------------------------------------- helpers


def _runs(root: Path) -> list[Path]:
    from .reports import find_runs

    return find_runs(root)


def _resolve_run(root: Path, run: str | None, path: Path | None) -> Path:
    from .reports import is_run_dir

    if path is not None:
        if not is_run_dir(path):
            raise CliError(f"{path} is not a debug_module run directory (no manifest.json with schema debug_module.run/1)",
                           hint="pass a directory made by the torch.compile debugging tools", kind="environment")
        return path
    runs = _runs(root)
    if run is not None:
        for p in runs:
            if p.name == run:
                return p
        raise CliError(f"no run {run!r} under {root}" + did_you_mean(run, [p.name for p in runs]),
                       hint="`inductor-debug list` shows the runs", kind="environment")
    if not runs:
        raise CliError(f"no runs under {root}", hint="pass --root, a run directory, or --model module:factory",
                       kind="environment")
    return runs[-1]


def _import_target(target: str, what: str) -> Any:
    """The module of ``module`` or ``path/to/file.py``."""
    from debug_framework.cli.user_code import import_module_or_file, is_file_target

    try:
        return import_module_or_file(target)
    except FileNotFoundError as e:
        if not is_file_target(target):
            raise
        raise CliError(f"{what}: {e}", kind="environment") from None


def _load_object(state: _State, spec: str, what: str) -> Any:
    """``module:attr`` or ``path/to/file.py:attr`` -> the attribute; its file counts as user code."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise CliError(f"{what} {spec!r} is not 'module:factory' or 'path/file.py:factory'")
    try:
        module = _import_target(target, what)
    except CliError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module failed to import: their environment
        raise CliError(f"{what}: cannot import {target!r}: {type(e).__name__}: {e}", kind="environment") from e
    if getattr(module, "__file__", None):
        state.user_files.add(module.__file__)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise CliError(f"{what}: {target!r} has no attribute {attr!r}", kind="environment") from None


def _input_sets(inputs: Any) -> list[Any]:
    """A factory's inputs: a tuple/dict/tensor is one call; a list of tuples/dicts is one call each."""
    if isinstance(inputs, list) and inputs and all(isinstance(i, tuple | dict) for i in inputs):
        return inputs
    if isinstance(inputs, list):
        return [tuple(inputs)]
    return [inputs]


def _call(fn: Any, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return fn(**inputs)
    if isinstance(inputs, tuple):
        return fn(*inputs)
    return fn(inputs)


def _demo() -> tuple[Any, list[Any], str]:
    import torch

    class DemoNet(torch.nn.Module):
        """Built-in demo: a conv + linear net whose data-dependent branch breaks the graph."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.head = torch.nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x).relu().mean(dim=(2, 3))
            if y.sum() > 0:  # data-dependent branch -> graph break
                y = y * 2
            return self.head(y)

    torch.manual_seed(0)
    return DemoNet(), [(torch.randn(2, 3, 8, 8),), (torch.randn(3, 3, 8, 8),)], "demo"


def _load_model(state: _State, model: str | None, inputs: str | None, demo: bool) -> tuple[Any, list[Any], str]:
    if demo:
        if model is not None:
            raise CliError("--demo and --model are exclusive")
        return _demo()
    assert model is not None
    made = _load_object(state, model, "--model")
    obj = made() if callable(made) and not hasattr(made, "forward") else made
    sets: Any = None
    if isinstance(obj, tuple) and len(obj) == 2 and callable(obj[0]):
        obj, sets = obj
    if inputs is not None:
        f = _load_object(state, inputs, "--inputs")
        sets = f() if callable(f) else f
    if sets is None:
        raise CliError("no inputs for the model", hint="pass --inputs module:factory (or let the model factory return (model, inputs))")
    name = type(obj).__name__ if not isinstance(obj, type(_load_model)) else getattr(obj, "__name__", "model")
    return obj, _input_sets(sets), name


def _analyze_model(root: Path, model: Any, input_sets: list[Any], name: str, *, lowering: str,
                   alignment: int | None, deny_ops: list[str]) -> Path:
    """Run the model through the guard inspector and the compile pipeline (warn mode), into a new run directory."""
    from .artifacts import RunDirectory
    from .config import MockConfig
    from .constraints import OpDenylistConstraint, ShapeConstraint
    from .guards import GuardInspector
    from .pipeline import CompilePipeline
    from .reports import save_guard_report

    cons = MockConfig().constraints()
    if alignment is not None:
        cons = [c for c in cons if not isinstance(c, ShapeConstraint)] + [ShapeConstraint(alignment=alignment)]
    if deny_ops:
        cons.append(OpDenylistConstraint(deny_ops))
    pipeline = CompilePipeline(constraints=cons, strict=False, lowering=lowering, artifact_root=root, name="inductor-debug")
    inspector = GuardInspector(model, backend=pipeline)
    logger = logging.getLogger("debug_module.constraints")
    level = logger.level
    logger.setLevel(logging.ERROR)  # violations are recorded in the run; the CLI prints them itself
    try:
        for args in input_sets:
            _call(inspector, args)
    finally:
        logger.setLevel(level)
    if pipeline.run is None:
        pipeline.run = RunDirectory(root, backend="inductor-debug", info={"strict": False})
    pipeline.run.set_status("complete", model=name, lowering=lowering)
    save_guard_report(inspector.report(), pipeline.run)
    return pipeline.run.path


def analyze_run(run_path: Path, kind: str) -> dict[str, Any]:
    """The ``analyze`` data for one run directory (see the JSON schema's ``$defs``)."""
    from .reports import collect_run

    r = collect_run(run_path)
    base = {"type": kind, "run_id": r["run_id"], "path": r["path"], "model": r["model"]}
    guards = r["guards"]
    if kind == "guards":
        return base | {
            "available": guards is not None,
            "fx_graph_count": r["fx_graph_count"],
            "graph_count": guards["graph_count"] if guards else r["fx_graph_count"],
            "graph_break_count": guards["graph_break_count"] if guards else None,
            "graph_breaks": guards["graph_breaks"] if guards else [],
            "recompilations": guards["recompilations"] if guards else [],
            "guard_sets": guards["guard_sets"] if guards else [],
        }
    if kind == "constraints":
        by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for v in r["violations"]:
            by[v.get("constraint", "?")].append(v)
        return base | {"violation_count": len(r["violations"]), "by_constraint": dict(sorted(by.items())),
                       "coverage": r["coverage"]}
    if kind == "graphs":
        graphs = []
        for g in r["graphs"]:
            stats_file = Path(r["path"]) / "statistics" / f"{g['name']}.json"
            ops: dict[str, int] = {}
            if stats_file.is_file():
                ops = json.loads(stats_file.read_text()).get("op_counts", {})
            graphs.append({"name": g["name"], "kind": g.get("kind"), "nodes": g.get("nodes"),
                           "violations": g.get("violations", 0),
                           "node_share": (g.get("coverage") or {}).get("node_share"),
                           "peak_memory_bytes": g.get("peak_memory_bytes"),
                           "top_ops": dict(Counter(ops).most_common(8))})
        return base | {"fx_graph_count": r["fx_graph_count"], "graphs": graphs, "files_by_kind": r["files_by_kind"]}
    kd = r["kerneldiff"]
    return base | {
        "backend": r["backend"], "status": r["status"], "created": r["created"],
        "file_count": r["file_count"], "files_by_kind": r["files_by_kind"],
        "fx_graph_count": r["fx_graph_count"], "aten_graph_count": len(r["graphs"]),
        "violation_count": len(r["violations"]),
        "graph_break_count": guards["graph_break_count"] if guards else None,
        "recompilation_count": len(guards["recompilations"]) if guards else None,
        "kerneldiff": None if kd is None else {"passed": kd["passed"], "model_name": kd["model_name"],
                                              "test_backend": kd["test_backend"],
                                              "reference_backend": kd["reference_backend"],
                                              "first_divergent_module": kd.get("first_divergent_module"),
                                              "failed": [d["name"] for d in kd["outputs"] + kd["gradients"] if not d["passed"]]},
        "repros": r["repros"],
    }


# ---------------------------------------------------------------------------------------------- commands

RootOpt = typer.Option(None, "--root", help=f"artifacts root (default: {DEFAULT_ARTIFACT_ROOT})")
JsonOpt = typer.Option(False, "--json", help="print one JSON document (stable schema)")


def _run(ctx: typer.Context, command: str, root: Path | None, as_json: bool, body: Callable[[_State], Outcome]) -> int:
    """Run a command body; print its document (``--json``) or its human output; return its exit code.
    Failures propagate to :func:`debug_framework.cli.framework.run_app`, which reports them."""
    state: _State = ctx.obj
    data, code, human = body(state.begin(command, root, as_json))
    if state.as_json:
        print_json(state.document(code, data, None))
    else:
        human()
    return code


@app.callback()
def _main(ctx: typer.Context, root: Path = typer.Option(Path(DEFAULT_ARTIFACT_ROOT), "--root", help="artifacts root"),
          as_json: bool = typer.Option(False, "--json", help="print one JSON document (stable schema)")) -> None:
    state: _State = ctx.obj
    state.root, state.as_json = root, as_json


def _list(state: _State) -> Outcome:
    from .reports import collect_run

    runs = []
    for p in _runs(state.root):
        r = collect_run(p)
        kd = r["kerneldiff"]
        runs.append({"run_id": r["run_id"], "path": r["path"], "created": r["created"], "backend": r["backend"],
                     "status": r["status"], "model": r["model"], "file_count": r["file_count"],
                     "files_by_kind": r["files_by_kind"], "graph_count": len(r["graphs"]),
                     "violation_count": len(r["violations"]),
                     "kerneldiff_passed": None if kd is None else kd["passed"], "repros": r["repros"]})

    def human() -> None:
        from debug_framework.cli.tables import fitted_table

        if not runs:
            print(f"no runs under {state.root}")
            return
        console = make_console()
        rows = [[r["run_id"], r["model"], r["backend"], r["status"], str(r["file_count"]), str(r["graph_count"]),
                 str(r["violation_count"]), {None: "-", True: "PASS", False: "FAIL"}[r["kerneldiff_passed"]]]
                for r in runs]
        console.print(fitted_table(f"runs under {state.root}", _LIST_COLUMNS, rows, console.width))

    return {"runs": runs}, EXIT_PASS, human


#: ``list``'s columns: the run id (what ``--run`` takes) is never cut or left out; on a narrow
#: terminal the counts go first, then the backend, so the model, status and verdict stay.
_LIST_COLUMNS = (Column("run", key=True), Column("model", min_width=10, keep=5), Column("backend", min_width=8, keep=4),
                 Column("status", min_width=6), Column("files", number=True, keep=1),
                 Column("graphs", number=True, keep=2), Column("violations", number=True, keep=3),
                 Column("KernelDiff", min_width=4))


@app.command("list")
def list_runs(ctx: typer.Context, root: Path | None = RootOpt, as_json: bool = JsonOpt) -> int:
    """List runs under the root and their artifacts."""
    return _run(ctx, "list", root, as_json, _list)


def _analyze(state: _State, run_dir: Path | None, type_: str, run: str | None, model: str | None,
             inputs: str | None, demo: bool, lowering: str, alignment: int | None, deny_op: list[str]) -> Outcome:
    if type_ not in ANALYSIS_TYPES:
        raise CliError(f"unknown analysis type {type_!r}" + did_you_mean(type_, ANALYSIS_TYPES), hint=one_of(ANALYSIS_TYPES))
    if lowering not in _LOWERINGS:
        raise CliError(f"unknown lowering {lowering!r}" + did_you_mean(lowering, _LOWERINGS), hint=one_of(_LOWERINGS))
    if (model is not None or demo) and (run_dir is not None or run is not None):
        raise CliError("analyze either a run (RUN_DIR/--run) or a model (--model/--demo), not both")
    if inputs is not None and model is None:
        raise CliError("--inputs needs --model")
    if model is not None or demo:
        obj, sets, name = _load_model(state, model, inputs, demo)
        path = _analyze_model(state.root, obj, sets, name, lowering=lowering, alignment=alignment, deny_ops=deny_op)
    else:
        path = _resolve_run(state.root, run, run_dir)
    data = analyze_run(path, type_)
    failed = type_ == "summary" and data["kerneldiff"] is not None and not data["kerneldiff"]["passed"]
    return data, (EXIT_FAIL if failed else EXIT_PASS), lambda: _print_analysis(data)


def _print_analysis(data: dict[str, Any]) -> None:
    from .cli_output import print_analysis

    print_analysis(data)


@app.command("analyze")
def analyze(
    ctx: typer.Context,
    run_dir: Path | None = typer.Argument(None, help="a run directory (default: --run, else the newest run under --root)"),
    type_: str = typer.Option("summary", "--type", "-t", help="guards | constraints | graphs | summary"),
    run: str | None = typer.Option(None, "--run", help="run id under --root"),
    model: str | None = typer.Option(None, "--model", help="analyze a user model: module:factory or file.py:factory"),
    inputs: str | None = typer.Option(None, "--inputs", help="its inputs: module:factory returning a tuple, dict, or list of them"),
    demo: bool = typer.Option(False, "--demo", help="analyze the built-in demo model"),
    lowering: str = typer.Option("eager", "--lowering", help="for --model/--demo: eager (fast) or inductor (IR + kernels)"),
    alignment: int | None = typer.Option(None, "--alignment", help="for --model/--demo: shape alignment constraint"),
    deny_op: list[str] = typer.Option([], "--deny-op", help="for --model/--demo: deny an op (repeatable)"),
    root: Path | None = RootOpt,
    as_json: bool = JsonOpt,
) -> int:
    """Analyze a run (guards, constraints, graphs, summary), or a model given as module:factory."""
    return _run(ctx, "analyze", root, as_json,
                lambda st: _analyze(st, run_dir, type_, run, model, inputs, demo, lowering, alignment, deny_op))


def _diff(state: _State, model: str | None, inputs: str | None, demo: bool, backend: str, reference: str | None,
          rtol: float | None, atol: float | None, gradients: bool, modules: bool, runs: int, plots: bool,
          minify: bool, minify_seconds: float) -> Outcome:
    if model is None and not demo:
        raise CliError("diff needs --model module:factory (or --demo)")
    obj, sets, name = _load_model(state, model, inputs, demo)
    test_backend: Any = _load_object(state, backend, "--backend") if ":" in backend else backend
    from .diff import KernelDiffHarness

    report = KernelDiffHarness(obj, sets[0], model_name=name, reference_backend=reference, test_backend=test_backend,
                               rtol=rtol, atol=atol, compare_gradients=gradients, compare_modules=modules,
                               runs=runs, artifact_root=state.root, minify_on_failure=minify,
                               minify_max_seconds=minify_seconds,
                               test_backend_spec=backend if ":" in backend else None).compare(generate_visualizations=plots)
    m = report.minifier or {}
    # the verified repro's folder (repro.py exits 1 while the bug is there); None when there is none
    repro = str(Path(m["repro"]).parent) if m.get("verified") and m.get("repro") else None
    data = {"run_id": report.run_id, "path": report.artifact_dir, "passed": report.passed,
            "reference": report.reference_backend, "first_divergent_module": report.first_divergent_module,
            "report": report.json_path, "failed": [d.name for d in report.failed], "repro": repro,
            "minifier": m or None}
    return data, (EXIT_PASS if report.passed else EXIT_FAIL), lambda: print(report.summary())


@app.command("diff")
def diff(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help="module:factory or file.py:factory"),
    inputs: str | None = typer.Option(None, "--inputs", help="module:factory returning the inputs"),
    demo: bool = typer.Option(False, "--demo", help="use the built-in demo model"),
    backend: str = typer.Option("inductor", "--backend", help="backend under test: a torch.compile name or module:attr"),
    reference: str | None = typer.Option(None, "--reference",
                                         help="float64 (ratio rule; the default without --rtol/--atol) | eager "
                                              "(tolerance; the default with them) | a backend name"),
    rtol: float | None = typer.Option(None, "--rtol", help="relative tolerance of the eager or backend "
                                      "reference (default: torch.testing's for the dtype); implies --reference eager"),
    atol: float | None = typer.Option(None, "--atol", help="absolute tolerance of the eager or backend "
                                      "reference (default: torch.testing's for the dtype); implies --reference eager"),
    gradients: bool = typer.Option(False, "--gradients", help="also compare gradients"),
    modules: bool = typer.Option(False, "--modules", help="also compare submodule outputs"),
    runs: int = typer.Option(3, "--runs", min=1, help="calls per side: the first is the first call, the rest "
                             "give steady-state latency"),
    plots: bool = typer.Option(False, "--plots", help="write visualizations"),
    minify: bool = typer.Option(True, "--minify/--no-minify",
                                help="on failure, minify to a verified repro (its folder is data.repro)"),
    minify_seconds: float = typer.Option(120.0, "--minify-seconds", min=1.0, help="the minifier's time budget"),
    root: Path | None = RootOpt,
    as_json: bool = JsonOpt,
) -> int:
    """KernelDiff a model: backend under test vs reference; exit 1 when it fails, with a verified repro."""
    return _run(ctx, "diff", root, as_json, lambda st: _diff(st, model, inputs, demo, backend, reference, rtol, atol,
                                                             gradients, modules, runs, plots, minify, minify_seconds))


def _report(state: _State, fmt: str, run: list[str], output: Path | None, benchmarks: Path | None) -> Outcome:
    import datetime as _dt

    from .reports import build_report, write_report

    root = state.root
    if fmt not in _REPORT_FORMATS:
        raise CliError(f"unknown format {fmt!r}" + did_you_mean(fmt, _REPORT_FORMATS), hint=one_of(_REPORT_FORMATS))
    if not root.is_dir():
        raise CliError(f"artifacts root {root} does not exist", hint="pass --root", kind="environment")
    if benchmarks is not None and not benchmarks.is_dir():
        raise CliError(f"benchmark directory {benchmarks} does not exist", kind="environment")
    try:
        data = build_report(root, run_ids=run or None, benchmarks_dir=benchmarks)
    except FileNotFoundError as e:
        raise CliError(str(e), hint="`inductor-debug list` shows the runs", kind="environment") from e
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    out = output or (root / "reports" / f"debug_report_{stamp}.{fmt}")
    html_path, json_path = write_report(data, out, fmt=fmt)
    result = {"format": fmt, "html": str(html_path) if html_path else None, "json": str(json_path),
              "summary": data["summary"]}
    return result, EXIT_PASS, lambda: print(f"wrote {html_path or json_path}" + (f" (and {json_path})" if html_path else ""))


@app.command("report")
def report(
    ctx: typer.Context,
    fmt: str = typer.Option("html", "-f", "--output-format", help="html (with its JSON twin) or json"),
    run: list[str] = typer.Option([], "--run", help="run id (repeatable; default: every run)"),
    output: Path | None = typer.Option(None, "-o", "--output-file", help="output file (default: <root>/reports/debug_report_<time>.<ext>)"),
    benchmarks: Path | None = typer.Option(None, "--benchmarks", help="directory of benchmark JSON files (default: <root>/benchmarks)"),
    root: Path | None = RootOpt,
    as_json: bool = JsonOpt,
) -> int:
    """Write the HTML (self-contained) or JSON debug report."""
    return _run(ctx, "report", root, as_json, lambda st: _report(st, fmt, run, output, benchmarks))


def _minify(state: _State, path: Path, output: Path | None, max_seconds: float | None, options: MinifyOptions) -> Outcome:
    try:
        from .minifier import minify_saved_graph
        from .minifier.saved import recorded_constraints
    except ImportError as e:
        raise CliError(f"the minifier is not available: {e}", kind="environment") from e
    if not path.exists():
        raise CliError(f"no such file or directory: {path}", kind="environment")
    from .cli_minify import build_constraints, build_signature

    constraints = build_constraints(options, recorded_constraints(path))  # default: what the run recorded
    signature = build_signature(options, constraints, lambda spec: _load_object(state, spec, "--backend"))
    # a MinifierError (DM010) is DF-coded: the framework reports its message and hint
    res = minify_saved_graph(path, signature, constraints=constraints, output_dir=output, max_seconds=max_seconds,
                             progress=not state.as_json)
    return res.to_dict(), EXIT_PASS, lambda: print(f"{res.summary()}\nrepro: {res.repro_path}")


@app.command("minify")
def minify(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="a repro directory, a run directory, or one of its graph files "
                                          "(aot_graphs/graph_000_forward.py, fx_graphs/graph_000.py)"),
    output: Path | None = typer.Option(None, "-o", "--output-dir", help="where the minimized repro goes"),
    max_seconds: float | None = typer.Option(None, "--max-seconds", help="the minifier's time budget in seconds "
                                             "(default: none, it runs until the graph is minimal)"),
    signature: str | None = typer.Option(None, "--signature", help="constraint:NAME[:OP], exception:TYPE[:PATTERN] "
                                         "or accuracy (default: the first constraint violation found)"),
    backend: str | None = typer.Option(None, "--backend", help="for exception/accuracy: a torch.compile backend name, "
                                       "module:attr or file.py:attr"),
    reference: str = typer.Option("eager", "--reference", help="for accuracy: eager or float64"),
    rtol: float = typer.Option(1e-4, "--rtol", help="for accuracy"),
    atol: float = typer.Option(1e-5, "--atol", help="for accuracy"),
    constraints: str | None = typer.Option(None, "--constraints", help="JSON file (or inline JSON) listing constraints "
                                           "as a manifest records them (default: the run's own)"),
    alignment: int | None = typer.Option(None, "--alignment", help="shape alignment constraint (replaces the run's)"),
    deny_op: list[str] = typer.Option([], "--deny-op", help="deny an op (repeatable)"),
    root: Path | None = RootOpt,
    as_json: bool = JsonOpt,
) -> int:
    """Minify a saved graph with debug_module.minifier (by default, the first violation of the run's own constraints)."""
    options = MinifyOptions(signature=signature, backend=backend, reference=reference, rtol=rtol, atol=atol,
                            constraints=constraints, alignment=alignment, deny_ops=deny_op)
    return _run(ctx, "minify", root, as_json, lambda st: _minify(st, path, output, max_seconds, options))


def _clean(state: _State, yes: bool, run: list[str]) -> Outcome:
    root = state.root
    targets = [p for p in _runs(root) if not p.is_symlink() and (not run or p.name in run)]
    unknown = sorted(set(run) - {p.name for p in targets})
    if unknown:
        raise CliError(f"no run {', '.join(unknown)} under {root}", kind="environment")
    confirmed = yes
    if targets and not yes:
        try:
            confirmed = typer.confirm(f"remove {len(targets)} run director{'y' if len(targets) == 1 else 'ies'} "
                                      f"under {root}?", default=False, err=True)
        except (typer.Abort, EOFError):
            confirmed = False
    removed = []
    if confirmed:
        for p in targets:
            shutil.rmtree(p)
            removed.append(p.name)
    data = {"removed": removed, "cancelled": bool(targets) and not confirmed,
            "kept": [p.name for p in targets if p.name not in removed]}
    return data, EXIT_PASS, lambda: print(f"removed {len(removed)} run(s)" + (" (cancelled)" if data["cancelled"] else ""))


@app.command("clean")
def clean(
    ctx: typer.Context,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    run: list[str] = typer.Option([], "--run", help="only these run ids (repeatable)"),
    root: Path | None = RootOpt,
    as_json: bool = JsonOpt,
) -> int:
    """Remove run directories created by debug_module (checked by their manifest); nothing else."""
    return _run(ctx, "clean", root, as_json, lambda st: _clean(st, yes, run))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: exits with the command's exit code."""
    raise SystemExit(run_app(app, _State(), argv))


if __name__ == "__main__":  # pragma: no cover
    main()
