"""The guided tour of debug_module (``debug-tour``, ``python -m debug_module.demo``).

    debug-tour                              # interactive: explain, run, show, then change knobs and re-run
    debug-tour --quick                      # every step with the defaults, no prompts (CI, a first look)
    debug-tour --quick --step minifier --fail-op aten.erf.default
    debug-tour --output /tmp/tour --batch 4 --padding 0 --alignment 1

Steps, on a one-layer BERT (seconds on a CPU): constraint checking, FX/AOT capture, Inductor IR,
KernelDiff, the minifier (a forced strict-mode failure reduced to a verified standalone repro that is
run once more), a quick benchmark (eager beside Inductor and the mock backend), the HTML report and
the command-line tools. Each step explains itself, says what ran, prints the real results and where
the artifacts went (under ``--output``, default ``./debug_artifacts/tour``; run directories in
``runs/``). See docs/tour.md.

Exit codes (:mod:`debug_framework.cli.framework`): 0 every step worked; 1 a step's own check failed
(a KernelDiff outside its tolerance, a repro that did not reproduce); 2 a usage or environment error
(a bad knob value is DF005); 3 an internal error (a bug; one line naming the crash log).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import typer

from debug_framework.cli.framework import CliError, Invocation, make_app, make_console, markup, run_app
from debug_framework.suggest import did_you_mean, one_of

from .knobs import KNOB_HELP, TourKnobs

__all__ = ["app", "main", "PROG", "DEFAULT_OUTPUT"]

PROG = "debug-tour"
DEFAULT_OUTPUT = Path("debug_artifacts/tour")

_HELP = ("A guided tour of debug_module on a tiny BERT: constraints, FX/AOT capture, Inductor IR, KernelDiff, "
         "the minifier, a benchmark, the HTML report and the CLIs. Interactive unless --quick.")
_EPILOG = "Steps: constraints, capture, inductor, kerneldiff, minifier, benchmark, report, cli."
app = make_app(_HELP, epilog=_EPILOG)
_D = TourKnobs()  # the defaults


@app.command(help=_HELP, epilog=_EPILOG)
def tour(
    ctx: typer.Context,
    quick: bool = typer.Option(False, "--quick", help="run the steps with these knobs, no prompts"),
    step: list[str] = typer.Option([], "--step", metavar="NAME", help="run only this step (repeatable; default: all)"),
    output: Path = typer.Option(DEFAULT_OUTPUT, "-o", "--output-dir", metavar="DIR", help="where the artifacts go"),
    batch: str = typer.Option(str(_D.batch), "--batch", metavar="N", help=KNOB_HELP["batch"]),
    seq: str = typer.Option(str(_D.seq), "--seq", metavar="N", help=KNOB_HELP["seq"]),
    padding: str = typer.Option(str(_D.padding), "--padding", metavar="N", help=KNOB_HELP["padding"]),
    alignment: str = typer.Option(str(_D.alignment), "--alignment", metavar="N", help=KNOB_HELP["alignment"]),
    deny_op: list[str] = typer.Option([], "--deny-op", metavar="OP", help="constraint: deny this ATen op (repeatable)"),
    rtol: str = typer.Option("default", "--rtol", metavar="X", help=KNOB_HELP["rtol"]),
    atol: str = typer.Option("default", "--atol", metavar="X", help=KNOB_HELP["atol"]),
    force_failure: bool = typer.Option(_D.force_failure, "--force-failure/--no-force-failure",
                                       help=KNOB_HELP["force_failure"]),
    fail_op: str = typer.Option(_D.fail_op, "--fail-op", metavar="OP", help=KNOB_HELP["fail_op"]),
    runs: str = typer.Option(str(_D.runs), "--runs", metavar="N", help=KNOB_HELP["runs"]),
) -> int:
    """Check every option first (DF005 on a bad one, before anything runs), then run the tour."""
    from .context import TourContext
    from .runner import STEP_NAMES, run_tour, show_knobs

    unknown = [s for s in step if s not in STEP_NAMES]
    if unknown:
        raise CliError(f"unknown step {unknown[0]!r}" + did_you_mean(unknown[0], STEP_NAMES), hint=one_of(STEP_NAMES))
    knobs = TourKnobs().changed({"batch": batch, "seq": seq, "padding": padding, "alignment": alignment,
                                 "deny_ops": ",".join(deny_op), "rtol": rtol, "atol": atol,
                                 "force_failure": "yes" if force_failure else "no", "fail_op": fail_op, "runs": runs})
    context = TourContext(output=output.expanduser().resolve(), knobs=knobs)
    context.output.mkdir(parents=True, exist_ok=True)
    console = make_console()
    console.print(markup("[bold]debug_module guided tour[/] on a tiny BERT; artifacts under {}", context.output))
    read_line = None if quick else _read_stdin
    if read_line is not None:
        console.print("knobs (change them after any step with knob=value):")
        show_knobs(console, context)
        if read_line("[Enter] start · q quit > ") in (None, "q", "quit"):
            return 0
    invocation: Invocation = ctx.obj
    return run_tour(console, context, step or list(STEP_NAMES), invocation, read_line)


def _read_stdin(prompt: str) -> str | None:
    """One answer from stdin (a terminal or a script); ``None`` at end of input."""
    try:
        return input(prompt)
    except EOFError:
        print()
        return None


class _TourInvocation(Invocation):
    """A failure raised by torch on the tour's model (a missing C++ compiler for Inductor, an unsupported
    platform) is the environment's (exit 2); anything else not DF-coded is a bug of ours (exit 3)."""

    def is_environment_error(self, exc: BaseException) -> bool:
        return super().is_environment_error(exc) or type(exc).__module__.split(".")[0] == "torch"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``debug-tour``, ``python -m debug_module.demo``): returns the exit code."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built locally; never reach the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return run_app(app, _TourInvocation(PROG), argv)

