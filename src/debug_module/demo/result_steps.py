"""The tour's later steps: KernelDiff, the minifier, a quick benchmark, the HTML report, the CLIs.

Each calls the project's own tool (KernelDiffHarness, the strict-mode repro writer and the minifier's
repro runner, debug_framework.measure, debug_module.reports, the ``inductor-debug`` CLI) and reports
what it really produced.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import subprocess
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from debug_framework.jsonio import dumps_json

from .context import MODEL_NAME, StepResult, TourContext, quiet_constraint_log

__all__ = ["run_kerneldiff", "run_minifier", "run_benchmark", "run_report", "run_cli", "next_commands", "ratio_text"]

#: The minifier's budget inside KernelDiff when a low tolerance makes it fail (seconds).
KERNELDIFF_MINIFY_SECONDS = 30.0


def run_kerneldiff(ctx: TourContext) -> StepResult:
    """Inductor against eager on the same inputs: by default the float64 ratio rule (Inductor's error
    against a float64 run no worse than eager's, times 2); with the rtol/atol knobs, that tolerance."""
    import importlib.util

    from ..diff import KernelDiffHarness

    k = ctx.knobs
    tolerance = {name: value for name, value in (("rtol", k.rtol), ("atol", k.atol)) if value is not None}
    model, inputs = ctx.model_and_inputs()
    plots = importlib.util.find_spec("matplotlib") is not None
    report = KernelDiffHarness(model, inputs, model_name=MODEL_NAME, test_backend="inductor", runs=3,
                               artifact_root=ctx.runs_root, minify_max_seconds=KERNELDIFF_MINIFY_SECONDS,
                               **tolerance).compare(generate_visualizations=plots)
    run_dir = Path(report.artifact_dir)
    artifacts = {"run": run_dir, "KernelDiff JSON": Path(report.json_path)}
    if plots:
        artifacts["plots"] = run_dir / "visualizations"
    if report.repro_path:  # a failure the minifier reduced
        artifacts["accuracy repro"] = Path(report.repro_path)
    ran = f"KernelDiffHarness(tiny BERT, test_backend='inductor', reference='{report.reference_backend}', runs=3" + "".join(
        f", {n}={v}" for n, v in tolerance.items()) + ").compare()"
    lines = report.summary().splitlines()
    if report.passed:
        return StepResult("ok", ran=ran, lines=lines, artifacts=artifacts, data={"passed": True, "headline": lines[0]})
    return StepResult("failed", ran=ran, lines=lines + ["KernelDiff failed: outputs fail the judge "
                                                        f"({', '.join(d.name for d in report.failed)})"],
                      artifacts=artifacts, data={"passed": False})  # headline: the last line, why it failed


def run_minifier(ctx: TourContext) -> StepResult:
    """Strict mode denies ``fail_op``; the strict-mode writer minifies the failing graph and verifies the
    repro in a fresh process; the step then runs the repro as a user would and requires exit 1."""
    k = ctx.knobs
    if not k.force_failure:
        return StepResult("skipped", ran="nothing (force_failure=no)",
                          lines=["no failure forced: set force_failure=yes to make one and minify it"])
    import torch

    from .. import constraint_error
    from ..backend.mock import make_mock_backend
    from ..constraints import OpDenylistConstraint
    from ..minifier.codegen import run_repro

    ran = f"torch.compile(tiny BERT, backend=make_mock_backend(strict=True, deny {k.fail_op}))"
    model, inputs = ctx.model_and_inputs()
    backend = make_mock_backend(strict=True, constraints=[OpDenylistConstraint([k.fail_op])],
                                artifact_root=ctx.runs_root)
    torch.compiler.reset()
    try:
        with torch.no_grad(), quiet_constraint_log():
            torch.compile(model, backend=backend)(**inputs)
    except Exception as exc:  # noqa: BLE001 - only a constraint error is the failure we forced
        error = constraint_error(exc)
        if error is None:
            raise
    else:
        return StepResult("failed", ran=ran, lines=[f"the model does not use {k.fail_op}: nothing failed, nothing "
                                                    "to minify (pick fail_op among the ops the capture step lists)"])
    run_dir = Path(backend.pipelines[-1].run_dir)
    backend.pipelines[-1].run.set_status("failed", model=MODEL_NAME, tour_step="minifier")
    lines = [f"strict mode raised {error.code}: {error.violations[0].describe()}"]
    if error.repro_path is None:
        return StepResult("failed", ran=ran, lines=lines + ["no verified repro was written (see the run's repros/)"],
                          artifacts={"run": run_dir})
    repro = Path(error.repro_path)
    summary = json.loads((repro.parent / "minify.json").read_text(encoding="utf-8"))
    lines.append(f"minifier: {summary['original_nodes']} -> {summary['nodes']} node(s) in {summary['calls']} oracle "
                 f"call(s); ops: {', '.join(summary['ops'])}; verified in a fresh process: {summary['verified']}")
    proof = run_repro(repro, summary["signature"], timeout=120.0, isolated=False)
    lines.append(f"ran `python {repro.name}`: exit {proof.returncode} "
                 + ("(reproduces the failure)" if proof.reproduced else "(did NOT reproduce)"))
    artifacts = {"run": run_dir, "repro": repro, "repro inputs": repro.parent / "inputs.safetensors",
                 "minifier summary": repro.parent / "minify.json"}
    return StepResult("ok" if proof.reproduced else "failed", ran=ran, lines=lines, artifacts=artifacts,
                      data={"repro": str(repro), "returncode": proof.returncode, "nodes": summary["nodes"],
                            "headline": f"{summary['original_nodes']} -> {summary['nodes']} node(s); " + lines[-1]})


def _quartiles(xs: list[float]) -> tuple[float, float]:
    """(first, third) quartile of ``xs`` (both the value itself for a single sample)."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


class Spread(TypedDict):
    """What :func:`ratio_text` reads of a timed side: its median and interquartile range."""

    median: float
    iqr: tuple[float, float]


def _interleaved(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """``runs`` timed calls of each function, interleaved: round ``i`` calls every function once,
    starting at a different one each round, so a busy spell of a shared machine slows every
    backend alike instead of the one that happened to be measured then."""
    from debug_framework.measure import Timer

    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[: i % len(names)]:
            with Timer() as t:
                fns[name]()
            samples[name].append(t.seconds)
    return samples


#: A ratio of medians is reported only when the two backends' interquartile ranges do not overlap
#: and neither spreads over more than this fraction of its median.
MAX_RELATIVE_SPREAD = 0.5


def machine_busy() -> str | None:
    """Why timings here say little about the backends (more runnable processes than CPUs for this
    one: every parallel region of an eager model waits for its threads), or None."""
    import os

    try:
        load, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return f"the machine is busy (load average {load:.1f} on {cpus} CPU(s))" if load > cpus else None


def ratio_text(anchor: Spread, other: Spread, busy: str | None = None) -> tuple[str, bool]:
    """``("2.31x", True)`` when the spreads allow a ratio of medians, else why not (``False``):
    a busy machine (``busy`` says why), a spread over :data:`MAX_RELATIVE_SPREAD` of a median, or
    interquartile ranges that overlap."""
    if busy:
        return f"not meaningful: {busy}", False
    a_lo, a_hi = anchor["iqr"]
    o_lo, o_hi = other["iqr"]
    spread = max((a_hi - a_lo) / anchor["median"], (o_hi - o_lo) / other["median"])
    if spread > MAX_RELATIVE_SPREAD:
        return f"not meaningful: timings spread {spread:.0%} of their median (a busy machine)", False
    if o_lo <= a_hi and a_lo <= o_hi:
        return "not meaningful: the spreads overlap (about the same speed)", False
    return f"{anchor['median'] / other['median']:.2f}x", True


def run_benchmark(ctx: TourContext) -> StepResult:
    """Eager (the anchor) beside Inductor and the mock accelerator backend: first call and steady
    latency, the backends' timed runs interleaved, each median with its interquartile range, and a
    ratio only where the spread allows one. Measured and printed, never judged; written as
    ``debug_module.benchmark/1`` for the report."""
    import platform

    import torch

    from debug_framework._torch.dynamo import lookup_backend
    from debug_framework.measure import Timer, TimedBackend, run_stats

    from ..backend.mock import make_mock_backend
    from ..reports import BENCHMARK_SCHEMA

    model, inputs = ctx.model_and_inputs()
    sides: list[tuple[str, Callable[..., object] | None]] = [("eager", None), ("inductor", lookup_backend("inductor")),
                                    ("mock_backend", make_mock_backend(strict=False, constraints=[]))]
    rows, fns = [], {}
    torch.compiler.reset()
    with torch.no_grad():
        for name, backend in sides:  # each compiled (first call) and warmed up before any timing
            timed = None if backend is None else TimedBackend(backend)
            fn = model if timed is None else torch.compile(model, backend=timed)
            with Timer() as first:
                fn(**inputs)
            for _ in range(2):
                fn(**inputs)
            fns[name] = lambda fn=fn: fn(**inputs)
            rows.append({"backend": name, "compile_s": None if timed is None else timed.compile_s,
                         "first_call_s": first.seconds, "kerneldiff": None,
                         "graph_count": None if timed is None else timed.calls})
        samples = _interleaved(fns, ctx.knobs.runs)
    for r in rows:
        r["latency_ms"] = run_stats(samples[r["backend"]], unit="ms", count_key="runs")
        r["latency_ms"]["iqr"] = [1000.0 * q for q in _quartiles(samples[r["backend"]])]
    anchor, busy = rows[0]["latency_ms"], machine_busy()
    lines = [f"{'backend':<14}{'compile s':>10}{'first call s':>13}{'median ms':>11}  {'IQR ms':<17}vs eager"]
    for r in rows:
        lat = r["latency_ms"]
        compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.3f}"
        ratio, meaningful = ("anchor", True) if r is rows[0] else ratio_text(anchor, lat, busy)
        r["ratio_vs_eager"] = anchor["median"] / lat["median"] if meaningful and r is not rows[0] else None
        iqr = f"{lat['iqr'][0]:.3f}-{lat['iqr'][1]:.3f}"
        lines.append(f"{r['backend']:<14}{compile_s:>10}{r['first_call_s']:>13.3f}{lat['median']:>11.3f}  "
                     f"{iqr:<17}{ratio}")
    lines.append(f"(batch {ctx.knobs.batch} x seq {ctx.knobs.seq}; {ctx.knobs.runs} timed runs per backend after "
                 "2 warm-up, interleaved; median and interquartile range; measured on this machine, not judged)")
    if busy:
        lines.append(f"{busy}: the latencies above are this moment's, not the backends'; run it on a quiet machine")
    doc = {"schema": BENCHMARK_SCHEMA, "name": "tour", "model": MODEL_NAME,
           "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "device": "cpu",
           "torch": torch.__version__, "python": platform.python_version(), "results": rows,
           "notes": "debug-tour quick benchmark: eager is the anchor; timed runs interleaved"}
    ctx.benchmarks_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.benchmarks_dir / "tour.json"
    path.write_text(dumps_json(doc) + "\n", encoding="utf-8")
    medians = ", ".join(f"{r['backend']} {r['latency_ms']['median']:.3f} ms" for r in rows)
    return StepResult("ok", ran="eager, torch.compile(backend='inductor') and the mock backend, same inputs",
                      lines=lines, artifacts={"benchmark JSON": path},
                      data={"rows": rows, "headline": f"medians: {medians} (eager is the anchor)"})


def run_report(ctx: TourContext) -> StepResult:
    """``inductor-debug report``'s own functions over every run of the tour and its benchmark."""
    from ..reports import build_report, write_report

    data = build_report(ctx.runs_root, benchmarks_dir=ctx.benchmarks_dir)
    html, js = write_report(data, ctx.output / "report.html")
    s = data["summary"]
    lines = [f"{s['runs']} run(s), {s['graphs']} ATen graph(s), {s['violations']} violation(s), "
             f"{s['graph_breaks']} graph break(s), KernelDiff {s['kerneldiff_passed']}/{s['kerneldiff_total']} "
             f"passed, {s['repros']} repro(s), {s['benchmarks']} benchmark file(s)",
             "open the HTML file in a browser: it is self-contained (plots embedded)"]
    assert html is not None
    return StepResult("ok", ran=f"build_report({ctx.runs_root}) + write_report(...)", lines=lines,
                      artifacts={"HTML report": html, "JSON twin": js}, data={"summary": s, "headline": lines[0]})


def next_commands(ctx: TourContext) -> list[str]:
    """The commands to run next on the tour's own artifacts (paths quoted for a POSIX shell)."""
    q = shlex.quote
    root, out = q(str(ctx.runs_root)), ctx.output
    cmds = [f"inductor-debug list --root {root}"]
    for step, kind in (("constraints", "constraints"), ("capture", "guards"), ("inductor", "graphs")):
        r = ctx.results.get(step)
        if r is not None and "run" in r.artifacts:
            cmds.append(f"inductor-debug analyze {q(str(r.artifacts['run']))} --type {kind}")
    cmds.append(f"inductor-debug report --root {root} --benchmarks {q(str(ctx.benchmarks_dir))} "
                f"-o {q(str(out / 'report.html'))}")
    m = ctx.results.get("minifier")
    if m is not None and "repro" in m.artifacts:
        repro = m.artifacts["repro"]
        cmds += [f"python {q(str(repro))}    # exit 1: the failure reproduces",
                 f"inductor-debug minify {q(str(repro.parent))} --max-seconds 30"]
    cmds += [f"debug-tour --step kerneldiff --rtol 0 --atol 0 --output {q(str(out))}    # fails (exit 1); "
             "the minifier reduces the mismatch to an accuracy repro",
             f"debug_validate --model-path {q(str(out / 'model'))} --alternative-backend pytorch "
             f"--database {q(str(out / 'sessions.db'))} --output-file {q(str(out / 'validation.html'))}"]
    return cmds


def run_cli(ctx: TourContext) -> StepResult:
    """Run ``inductor-debug list --json`` on the tour's runs for real; save the model for
    ``debug_validate``; print the commands to run next with the tour's paths."""
    import transformers

    model, _ = ctx.model_and_inputs()
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(ctx.output / "model")
    cmd = [sys.executable, "-m", "debug_module", "list", "--root", str(ctx.runs_root), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return StepResult("failed", ran="inductor-debug list --json",
                          lines=[f"inductor-debug list exited {proc.returncode}: {proc.stderr.strip()[-400:]}"])
    runs = json.loads(proc.stdout)["data"]["runs"]
    listed = ", ".join(f"{r['run_id']} ({r['backend']}, {r['status']})" for r in runs[-4:]) + (
        " ..." if len(runs) > 4 else "")
    lines = [f"ran `inductor-debug list --root {ctx.runs_root} --json`: {len(runs)} run(s)"
             + (f": {listed}" if runs else " yet (the other steps make them: debug-tour --quick)"), "next, try:"]
    lines += [f"  {c}" for c in next_commands(ctx) if runs or "--root" not in c]
    return StepResult("ok", ran="inductor-debug list --json (a subprocess)", lines=lines,
                      artifacts={"model for debug_validate": ctx.output / "model"},
                      data={"runs": len(runs), "headline": f"inductor-debug list: {len(runs)} run(s); commands above"})
