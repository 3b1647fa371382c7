"""The tour's order of steps and the loop that runs them, prompting between steps when interactive."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from debug_framework.cli.framework import (EXIT_FAIL, EXIT_INTERRUPTED, EXIT_PASS, Invocation, add_row, failure_of,
                                           literal, markup)
from debug_framework.errors import ConfigurationError
from debug_framework.jsonio import dumps_json

from .compile_steps import run_capture, run_constraints, run_inductor
from .context import Step, StepResult, TourContext
from .knobs import KNOB_HELP, parse_assignments
from .result_steps import run_benchmark, run_cli, run_kerneldiff, run_minifier, run_report

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["STEPS", "STEP_NAMES", "TOUR_SCHEMA", "run_tour", "show_knobs"]

#: The schema of ``<output>/tour.json``.
TOUR_SCHEMA = "debug_module.tour/1"

#: Reads one line of the user's answer; ``None`` at end of input.
ReadLine = Callable[[str], "str | None"]

STEPS: tuple[Step, ...] = (
    Step("constraints", "Constraint checking",
         "A custom accelerator cannot run everything: some ops are missing, dims must be aligned, dtypes and "
         "layouts are limited. debug_module checks every ATen graph torch.compile produces against such "
         "constraints, from fake-tensor metadata (nothing runs on a device), and names the source line of "
         "each violation. Warn mode records them; strict mode raises.",
         ("batch", "seq", "padding", "alignment", "deny_ops"), run_constraints),
    Step("capture", "FX and AOTAutograd capture",
         "Dynamo turns Python into an FX graph (graph breaks split it); AOTAutograd traces that into forward and "
         "backward ATen graphs. Every graph, its statistics, guards and graph breaks go into a run directory.",
         ("batch", "seq", "padding"), run_capture),
    Step("inductor", "Inductor IR and kernels",
         "The same ATen graph compiled by Inductor: its scheduler IR before and after fusion and the C++ (or "
         "Triton) kernels it generates, captured into the run, so a wrong kernel can be read.",
         ("batch", "seq", "padding"), run_inductor),
    Step("kerneldiff", "KernelDiff: numerical comparison",
         "Inductor against eager on the same inputs, every output compared by the project's comparison core. "
         "Lower the tolerances (rtol=0 atol=0) to see a failure, and the minifier reduce it.",
         ("batch", "seq", "padding", "rtol", "atol"), run_kerneldiff),
    Step("minifier", "Minifier: a forced failure, reduced and verified",
         "Strict mode with fail_op denied makes compilation fail. The strict-mode writer reduces the failing "
         "graph to the fewest nodes that still fail, writes a standalone repro.py (torch and safetensors only) "
         "and verifies it in a fresh process; the tour runs it once more to prove it.",
         ("force_failure", "fail_op", "batch", "seq", "padding"), run_minifier),
    Step("benchmark", "Quick benchmark",
         "Eager is the anchor; Inductor and the mock accelerator backend run beside it on the same inputs. "
         "Figures are measured on this machine and printed, never judged.",
         ("runs", "batch", "seq"), run_benchmark),
    Step("report", "HTML report",
         "One self-contained HTML page (and its JSON twin) over every run and benchmark of the tour: "
         "violations with source lines, graphs, guards, KernelDiff plots, repros.",
         (), run_report),
    Step("cli", "The command-line tools",
         "Everything the tour did is reachable from the command line: inductor-debug over run directories, "
         "debug_validate for whole-model validation sessions.",
         (), run_cli),
)
STEP_NAMES: tuple[str, ...] = tuple(s.name for s in STEPS)

_STATUS_STYLE = {"ok": "green", "skipped": "yellow", "failed": "red", "error": "red"}


def show_knobs(console: Console, ctx: TourContext, names: Sequence[str] | None = None) -> None:
    """One line per knob (value and meaning), or only ``names``."""
    values = ctx.knobs.as_dict()
    for name in names if names is not None else list(values):
        value = values[name]
        if isinstance(value, bool):
            shown: object = "yes" if value else "no"
        else:
            shown = ",".join(value) if isinstance(value, tuple) else ("default" if value is None else value)
        console.print(markup("  [cyan]{}[/]={}  [dim]{}[/]", name, shown if shown != "" else "-", KNOB_HELP[name]))


def _run_step(console: Console, ctx: TourContext, step: Step, index: int, invocation: Invocation) -> StepResult:
    console.rule(markup("[bold]{}/{} {}[/]: {}", index, len(STEPS), step.name, step.title))
    console.print(markup("[dim]{}[/]", step.explanation))
    if step.knobs:
        console.print("knobs:")
        show_knobs(console, ctx, step.knobs)
    t0 = time.perf_counter()
    try:
        with console.status(markup("running {} ...", step.name)):
            result = step.run(ctx)
    except Exception as exc:  # noqa: BLE001 - classified by the framework: 2 environment/usage, 3 a bug
        failure = failure_of(exc, invocation)
        result = StepResult("error", lines=[failure.line(f"{invocation.prog} step {step.name}")],
                            exit_code=failure.exit_code)
    result.seconds = time.perf_counter() - t0
    ctx.results[step.name] = result
    _print_result(console, step, result)
    return result


def _print_result(console: Console, step: Step, result: StepResult) -> None:
    if result.ran:
        console.print(markup("[bold]ran[/]: {}", result.ran))
    for line in result.lines:  # soft wrap: a command or a path stays one line when copied
        console.print(literal(line), soft_wrap=True)
    if result.artifacts:
        console.print("[bold]artifacts[/]:")
        for label, path in result.artifacts.items():
            console.print(markup("  {}: {}", label, path), soft_wrap=True)
    style = _STATUS_STYLE[result.status]
    console.print(markup(f"[{style}]{{}}[/] {{}} ({{}} s)", result.status, step.name, f"{result.seconds:.1f}"))


def _ask(console: Console, ctx: TourContext, read_line: ReadLine, step: Step) -> str:
    """After a step: ``next``, ``rerun`` (knobs changed) or ``quit``. Bad knob values are explained and asked again."""
    while True:
        answer = read_line(f"[Enter] next step · knob=value ... to change knobs and re-run {step.name} · "
                           "k list knobs · q quit > ")
        if answer is None or answer.strip().lower() in ("q", "quit", "exit"):
            return "quit"
        text = answer.strip()
        if not text:
            return "next"
        if text.lower() in ("k", "knobs", "?", "help"):
            show_knobs(console, ctx)
            continue
        try:
            changes = parse_assignments(text)
            ctx.knobs = ctx.knobs.changed(changes)
        except ConfigurationError as exc:
            console.print(markup("[red]{}[/]", str(exc)))
            continue
        shown = " ".join(f"{k}={v}" for k, v in changes.items())
        if not {k.strip().replace("-", "_") for k in changes} & set(step.knobs):
            console.print(markup("knobs now: {}; {} does not use them, the steps that do will", shown, step.name))
            continue
        console.print(markup("knobs now: {}; re-running {}", shown, step.name))
        return "rerun"


def run_tour(console: Console, ctx: TourContext, names: Sequence[str], invocation: Invocation,
             read_line: ReadLine | None) -> int:
    """Run the steps named (in the tour's order); ``read_line`` makes it interactive. Returns the exit
    code: 0 when every step worked, else the worst (1 a step's check failed, 2/3 a step raised)."""
    chosen = [(i, s) for i, s in enumerate(STEPS, 1) if s.name in names]
    try:
        for index, step in chosen:
            while True:
                _run_step(console, ctx, step, index, invocation)
                action = "next" if read_line is None else _ask(console, ctx, read_line, step)
                if action != "rerun":
                    break
            if action == "quit":
                break
    except KeyboardInterrupt:  # keep what the finished steps found; run_app reports the interrupt (exit 130)
        _write_summary(ctx, [s for _, s in chosen], EXIT_INTERRUPTED)
        raise
    return _summary(console, ctx, [s for _, s in chosen], invocation)


def _summary(console: Console, ctx: TourContext, steps: Sequence[Step], invocation: Invocation) -> int:
    import sys

    from rich.table import Table

    table = Table(title="tour summary")
    for column in ("step", "status", "seconds", "result"):
        table.add_column(column)
    code = EXIT_PASS
    for step in steps:
        r = ctx.results.get(step.name)
        if r is None:
            add_row(table, step.name, "not run", "-", "")
            continue
        add_row(table, step.name, r.status, f"{r.seconds:.1f}", summary_cell(r.headline))
        if not r.worked:
            code = max(code, r.exit_code or EXIT_FAIL)
            why = r.headline
            print(why if r.status == "error" else f"{invocation.prog}: step {step.name!r} failed: {why}", file=sys.stderr)
    console.print(table)
    summary = _write_summary(ctx, steps, code)
    console.print(markup("artifacts under {} (step by step: {})", ctx.output, summary))
    return code


#: The longest result the summary table shows whole; a longer one (a failure's message) is shortened
#: at a word, saying so: the step's own output above has it all.
SUMMARY_CELL_CHARS = 240


def summary_cell(headline: str, limit: int = SUMMARY_CELL_CHARS) -> str:
    """``headline`` for the summary's result column: whole (the table wraps it at any width), or,
    past ``limit`` characters, up to the last whole word with "... (see the step's output)" after
    it; never cut inside a word or a number ("1 benchmark f", "| li")."""
    if len(headline) <= limit:
        return headline
    cut = headline[:limit + 1].rsplit(None, 1)[0] if " " in headline[:limit + 1] else headline[:limit]
    return cut.rstrip(" ,;:") + " ... (see the step's output)"


def _write_summary(ctx: TourContext, steps: Sequence[Step], code: int) -> Path:
    """``<output>/tour.json``: the knobs, and each step's status, results and artifacts (schema ``debug_module.tour/1``)."""
    doc = {"schema": TOUR_SCHEMA, "exit_code": code, "knobs": ctx.knobs.as_dict(),
           "steps": [{"name": s.name, "status": r.status, "seconds": round(r.seconds, 3), "ran": r.ran,
                      "lines": r.lines, "artifacts": {k: str(p) for k, p in r.artifacts.items()}}
                     for s in steps if (r := ctx.results.get(s.name)) is not None]}
    path = ctx.output / "tour.json"
    path.write_text(dumps_json(doc) + "\n", encoding="utf-8")
    return path
