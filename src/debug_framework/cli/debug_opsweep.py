"""``debug_opsweep``: op-by-op conformance of a ``torch.compile`` backend over PyTorch's OpInfo operators.

    debug_opsweep --compile-backend inductor --dtypes float32
    debug_opsweep --compile-backend-file my_backend.py --ops softmax,cumsum,nn.functional.gelu --json
    debug_opsweep --compile-backend aot_eager --ops 'nn.functional.*' --junit opsweep.xml
    debug_opsweep --compile-backend inductor --grad --ops softmax,cumsum      # the backward pass
    debug_opsweep --runtime NAME --ops softmax,cumsum          # an engine's ONNX runtime: single-op ONNX graphs
    debug_opsweep --compile-backend inductor --device cuda                    # where a CUDA device exists
    debug_opsweep --upgrade-repros opsweep_repros     # older repros' scripts to the current (torch-only) one

Every sample (OpInfo's, all of them, plus fuzzed layouts, special values and magnitudes) is judged
against float64 eager by the calibrated rule; random, uninitialised and non-numeric operators are
skipped with their reason. The sweep is stored in the session database (one row per operator) and
resumes: the same command run again skips the operators already done. The worst sample of a
failing operator gets a standalone repro (``python repro.py``). Exit codes: 0 no operator failed,
1 an operator failed (a numerical mismatch, an error, a crash or a hang), 2 usage or environment
error, 3 internal error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..conformance.runtime_lookup import runtime_names
from ..jsonio import JsonObject
from .framework import (EXIT_FAIL, EXIT_PASS, CliError, Invocation, make_app, make_console, markup,
                        print_json, run_app)
from .tables import Column, fitted_table
from .validate_support import check_database_path

if TYPE_CHECKING:
    from ..conformance.results import OpResult

__all__ = ["app", "main"]

PROG = "debug_opsweep"
_HELP = ("Sweep a torch.compile backend (or an ONNX runtime, through single-op ONNX graphs) over every PyTorch "
         "OpInfo operator it accepts, each sample judged "
         "against float64 eager by the calibrated rule. Exit 0 no operator failed, 1 an operator failed, "
         "2 usage/environment error, 3 internal error.")
app = make_app(_HELP)
_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _backend_file(spec: str | None) -> tuple[str | None, str]:
    if spec is None:
        return None, "backend"
    path, _, attr = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if not Path(path).is_file():
        raise CliError(f"--compile-backend-file {spec!r}: no such file", hint="give a Python file defining `backend` "
                       "(a torch.compile backend), or FILE:NAME for another name")
    if attr and not attr.isidentifier():
        raise CliError(f"--compile-backend-file {spec!r}: {attr!r} is not a Python name")
    return str(Path(path).resolve()), attr or "backend"


@app.command(help=_HELP)
def opsweep(
    ctx: typer.Context,
    compile_backend: str = typer.Option("aot_eager", "--compile-backend", help="registered torch.compile backend "
                                        "(inductor, aot_eager, eager, mock_accel, ...)"),
    backend_file: str | None = typer.Option(None, "--compile-backend-file", metavar="FILE[:NAME]",
                                            help="Python file whose `backend` (or NAME) is the torch.compile backend"),
    runtime: str | None = typer.Option(None, "--runtime", help="sweep an engine's ONNX runtime instead: "
                                       f"{' or '.join(runtime_names())} (each sample's operator exported alone "
                                       "with torch.onnx)"),
    device: str = typer.Option("cpu", "--device", help="device the samples run on (cpu, cuda, ...; with --runtime "
                               "the runtime's device); exit 2 where it does not exist"),
    ops: list[str] | None = typer.Option(None, "--ops", help="operator keys or shell patterns, comma-separated "
                                         "or repeated (default: every OpInfo operator)"),
    dtypes: list[str] | None = typer.Option(None, "--dtypes", help="comma-separated, of float32, bfloat16, float16, "
                                            "float64 (default: float32,bfloat16,float16)"),
    grad: bool = typer.Option(False, "--grad", help="judge the backward pass (every floating input's gradient) "
                              "instead of the forward"),
    workers: int = typer.Option(2, "--workers", min=1, help="worker processes (one per core)"),
    timeout: float = typer.Option(120.0, "--timeout", min=0.1, help="seconds a sample (its compile included) may run "
                                  "before it counts as a hang"),
    max_samples: int | None = typer.Option(None, "--max-samples", min=1, help="at most N samples per operator and "
                                           "dtype (a quick look) (default: all)"),
    fuzz: bool = typer.Option(True, "--fuzz/--no-fuzz", help="add fuzzed layouts, special values and magnitudes"),
    seed: int = typer.Option(0, "--seed", help="seed of the fuzzed samples"),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="skip operators the database already has for "
                                "this sweep"),
    repro_dir: Path = typer.Option(Path("opsweep_repros"), "--repro-dir", help="where the worst samples' repros go"),
    verify_repros: bool = typer.Option(True, "--verify/--no-verify", help="run each repro once in a fresh process"),
    junit: Path | None = typer.Option(None, "--junit", help="also write JUnit XML (one testcase per operator) here"),
    list_ops: bool = typer.Option(False, "--list-ops", help="print the OpInfo operator keys and exit"),
    upgrade: Path | None = typer.Option(None, "--upgrade-repros", metavar="DIR", help="rewrite the repro.py of "
                                        "every sweep repro under DIR to the current script (torch alone), verify "
                                        "each (unless --no-verify), and exit; no sweep runs"),
    as_json: bool = typer.Option(False, "--json", help="print the sweep as JSON on stdout (no table)"),
    database: str | None = typer.Option(None, "--database", help="session database (a file or a postgresql:// URL)"),
) -> int:
    """Run (or resume) the sweep, print one row per operator, and return the exit code."""
    invocation: Invocation = ctx.obj
    invocation.as_json = as_json
    chosen = _split(dtypes) or ["float32", "bfloat16", "float16"]
    for d in chosen:
        if d not in _DTYPES:
            from ..suggest import did_you_mean

            raise CliError(f"unknown dtype {d!r}{did_you_mean(d, _DTYPES)}", hint=f"use some of {', '.join(_DTYPES)}")
    file, attr = _backend_file(backend_file)
    if runtime is not None and (file is not None or _given(ctx, "compile_backend")):
        raise CliError("--runtime runs single-op ONNX graphs: it takes no --compile-backend or --compile-backend-file",
                       hint="give one of --runtime, --compile-backend, --compile-backend-file")
    if upgrade is not None:
        return _upgrade(upgrade, verify_repros, as_json)
    if list_ops:
        from ..conformance.ops import select_ops

        keys = select_ops(_split(ops))
        if as_json:
            print_json({"ops": keys})
        else:
            print("\n".join(keys))
        return EXIT_PASS
    from .. import get_framework_config
    from ..config import default_database_path
    from ..conformance import SweepSettings, render_junit, run_sweep
    from ..errors import unwritable_output

    fw = get_framework_config()
    if database:
        fw["database_path"] = database
    invocation.database = check_database_path(default_database_path(fw))
    label = runtime or (compile_backend if file is None else f"{Path(file).name}:{attr}")
    settings = SweepSettings(backend=label, backend_file=file, backend_attr=attr, runtime=runtime, device=device,
                             dtypes=chosen, grad=grad,
                             ops=_split(ops) or None, fuzz=fuzz, seed=seed, timeout_s=timeout, workers=workers,
                             repro_dir=repro_dir, verify_repros=verify_repros, resume=resume, max_samples=max_samples)
    with _progress() as progress:  # with --json, stdout is the JSON alone and stderr stays quiet
        result = run_sweep(settings, database=fw["database_path"], progress=None if as_json else progress)
    if junit is not None:
        try:
            junit.write_text(render_junit(result), encoding="utf-8")
        except OSError as exc:
            raise unwritable_output(exc, f"write the JUnit XML to {junit}", hint="pass --junit a writable file path",
                                    option="--junit") from exc
    if as_json:
        print_json({"status": "passed" if result.passed else "failed", **result.to_dict()})
    else:
        _print(result.to_dict())
    return EXIT_PASS if result.passed else EXIT_FAIL


def _upgrade(root: Path, verify_them: bool, as_json: bool) -> int:
    """``--upgrade-repros``: rewrite the scripts, verify each once, print what each did."""
    from ..conformance.repro import upgrade_repros
    from ..repro_format import verify

    rows = []
    for script in upgrade_repros(root):
        row: JsonObject = {"repro": str(script), "reproduced": None}
        if verify_them:
            found = verify(script)
            row.update(reproduced=found.reproduced, verdict=found.verdict, detail=found.detail)
        rows.append(row)
    if as_json:
        print_json({"upgraded": rows})
        return EXIT_PASS
    out = make_console()
    for row in rows:
        state = "" if row["reproduced"] is None else (" (reproduced)" if row["reproduced"] else
                                                      f" (not reproduced: {row['verdict']}: {row['detail']})")
        out.print(markup("upgraded {}{}", row["repro"], state))
    out.print(markup("{} repro scripts rewritten under {}", len(rows), str(root)))
    return EXIT_PASS


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` was given on the command line (not its default)."""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")


@contextmanager
def _progress() -> Iterator[Callable[[OpResult, int, int], None]]:
    """On stderr, a line per operator (its verdict, the samples judged, the time elapsed and the
    estimate of the time left, :class:`~debug_framework.conformance.progress.SweepProgress`); on a
    terminal also a transient bar with the estimate. Plain lines elsewhere."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from ..conformance.progress import SweepProgress

    err = make_console(stderr=True)
    state = SweepProgress()
    with Progress(TextColumn("op sweep"), BarColumn(), TextColumn("{task.completed}/{task.total} operators"),
                  TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("", total=None)

        def show(r: OpResult, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            err.print(state.line(r, done, total), markup=False, highlight=False, soft_wrap=True)

        yield show


#: The sweep table's columns: the operator (what ``--ops`` takes) is never cut or left out.
_COLUMNS = (Column("operator", key=True), Column("verdict", min_width=7), Column("pass rate", number=True, keep=2),
            Column("samples", number=True, keep=1), Column("worst sample", min_width=10, keep=3),
            Column("reason", min_width=12))


def _print(sweep: JsonObject) -> None:
    out = make_console()
    rows = []
    for o in sweep["operators"]:
        if o["verdict"] in ("pass", "skipped", "unsupported"):
            continue
        w = o["worst"] or {}
        rate = "-" if o["pass_rate"] is None else f"{100 * o['pass_rate']:.0f}%"
        rows.append([str(o["op"]), str(o["verdict"]), rate, str((o["counts"] or {}).get("samples", "")),
                     f"{w.get('source', '')}/{w.get('label', '')} {w.get('dtype', '')}", str(o["reason"] or "")])
    t = fitted_table(f"op sweep of {sweep['backend']} on {sweep['device']} ({', '.join(sweep['dtypes'])}; "
                     f"{sweep['seconds']:.1f} s)", _COLUMNS, rows, out.width, styles=["red"] * len(rows))
    if t.row_count:
        out.print(t)
        for o in sweep["operators"]:
            if o["repro"]:
                out.print(markup("  {} repro: python {} ({})", o["op"], o["repro"],
                                 "verified" if o["repro_verified"] else "not verified"))
            elif (o["worst"] or {}).get("repro_error"):
                out.print(markup("  {} repro not written: {}", o["op"], o["worst"]["repro_error"]))
    v = sweep["verdicts"]
    out.print(markup("{} operators: {} passed, {} failed, {} error, {} crash, {} hang, {} unsupported, {} skipped "
                     "({} read back from the database; sweep {})", len(sweep["operators"]), v["pass"], v["fail"],
                     v["error"], v["crash"], v["hang"], v["unsupported"], v["skipped"], sweep["resumed"],
                     sweep["sweep_key"]))
    from ..conformance.progress import samples_text

    counts = sweep["samples"] if isinstance(sweep.get("samples"), dict) else {}
    out.print(markup("{} over {} operators", samples_text({k: int(v) for k, v in counts.items()
                                                           if isinstance(v, int)}), len(sweep["operators"])))
    out.print("[bold green]PASSED[/]" if sweep["passed"] else "[bold red]FAILED[/]: some operators fail (see above)")


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and ``python -m``): runs the sweep; returns the exit code."""
    return run_app(app, Invocation(PROG), argv)


if __name__ == "__main__":
    sys.exit(main())
