"""``debug_validate``: validate a model's alternative backend against a reference, from the shell.

    debug_validate --model-path ./my-model --alternative-backend pytorch --isolate
    python -m debug_framework.cli.debug_validate --model-path m --json > result.json

Exit codes: 0 every checkpoint within tolerance, 1 numerical failure, 2 usage or environment
error (a DF-coded error: bad path, unavailable backend, bad configuration...).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["main", "build_parser"]

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 as well; keep the message short
        self.print_usage(sys.stderr)
        print(f"debug_validate: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="debug_validate", description="Validate an alternative backend against a reference backend, "
                "checkpoint by checkpoint. Exit 0 pass, 1 numerical failure, 2 usage/environment error.")
    p.add_argument("--model-path", required=True, help="model directory or file (.safetensors, .zt with config.json)")
    p.add_argument("--reference-backend", default="python_reference", help="default: python_reference")
    p.add_argument("--alternative-backend", default="auto", help="backend name or 'auto' (default)")
    p.add_argument("--config-file", type=Path, help="JSON file of session configuration keys")
    p.add_argument("--output-file", type=Path, help="write the result: JSON, or the HTML report if it ends in .html")
    p.add_argument("--verbose", action="store_true", help="every checkpoint in the table, and the isolation table")
    p.add_argument("--checkpoints", help="comma list: post_embedding,post_attention,post_mlp,post_processing or post_mlp:3")
    p.add_argument("--layers", help="layer range START:STOP (per-layer checkpoints of these layers)")
    p.add_argument("--dtype", help="the alternative's compute dtype (float32, float16, bfloat16, float64)")
    p.add_argument("--reference-dtype", help="the reference's compute dtype (default float64 for python_reference)")
    p.add_argument("--device", help="the alternative's device (cpu, cuda, ...)")
    p.add_argument("--rtol", type=float, help="relative tolerance (all checkpoints)")
    p.add_argument("--atol", type=float, help="absolute tolerance (all checkpoints)")
    iso = p.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_const", const=True,
                     help="require per-layer isolation (introduced vs propagated error)")
    iso.add_argument("--no-isolate", dest="isolate", action="store_const", const=False, help="skip isolation")
    p.add_argument("--oracle", action="store_true", help="judge by the ratio rule against a float64 python_reference")
    p.add_argument("--noise-floor", action="store_true", help="run each backend twice; report nondeterminism")
    p.add_argument("--text", action="append", help="input sentence (repeatable); default: seeded random tokens")
    p.add_argument("--seed", type=int, help="seed of the random inputs")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout (no table)")
    p.add_argument("--database", help="SQLite database (default: PIE_DEBUG_DATABASE or ~/.pie/debug/debug_framework.db)")
    return p


def _session_config(args: argparse.Namespace) -> dict[str, Any]:
    from ..errors import ValidationError

    cfg: dict[str, Any] = {}
    if args.config_file is not None:
        try:
            cfg = json.loads(args.config_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValidationError(f"cannot read the config file: {exc}", file=str(args.config_file)) from exc
        except json.JSONDecodeError as exc:
            raise ValidationError(f"the config file is not JSON: {exc}", file=str(args.config_file)) from exc
        if not isinstance(cfg, dict):
            raise ValidationError("the config file must hold a JSON object", file=str(args.config_file))
    if args.checkpoints:
        cfg["enabled_checkpoints"] = [c.strip() for c in args.checkpoints.split(",") if c.strip()]
    if args.layers:
        lo, _, hi = args.layers.partition(":")
        try:
            cfg["layers"] = [int(lo), int(hi)]
        except ValueError as exc:
            raise ValidationError(f"--layers must be START:STOP, got {args.layers!r}") from exc
    thresholds = dict(cfg.get("precision_thresholds") or {})
    if args.rtol is not None:
        thresholds["rtol"] = args.rtol
    if args.atol is not None:
        thresholds["atol"] = args.atol
    if thresholds:
        cfg["precision_thresholds"] = thresholds
    for flag, key in (("dtype", "dtype"), ("reference_dtype", "reference_dtype"), ("device", "device"),
                      ("seed", "seed")):
        if getattr(args, flag) is not None:
            cfg[key] = getattr(args, flag)
    if args.isolate is not None:
        cfg["isolate"] = args.isolate
    if args.oracle:
        cfg["oracle"] = True
    if args.noise_floor:
        cfg["noise_floor"] = True
    if args.text:
        cfg["input_text"] = args.text
    return cfg


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{digits}e}"
    return str(v)


def _table(result: dict[str, Any], verbose: bool) -> Table:
    """Checkpoints in model order; the first divergence highlighted, layers that introduce error marked."""
    first = result.get("first_divergence") or {}
    t = Table(title=f"{result['alternative_backend']} ({result['alternative_dtype']}) vs "
                    f"{result['reference_backend']} ({result['reference_dtype']})")
    t.add_column("checkpoint", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    for col in ("max abs", "rel L2", "miss %", "introduced", "carried in"):
        t.add_column(col, justify="right", no_wrap=True)
    rows = result["results"]
    shown = rows if verbose or len(rows) <= 40 else [
        r for i, r in enumerate(rows) if not r["passed"] or i < 5 or i >= len(rows) - 3]
    for r in shown:
        m = r.get("metrics") or {}
        key = r["checkpoint"] if r["layer"] is None else f"{r['checkpoint']}:{r['layer']}"
        is_first = bool(first) and r["checkpoint"] == first.get("checkpoint") and r["layer"] == first.get("layer")
        verdict = "pass" if r["passed"] else "FAIL"
        if is_first:
            verdict += " <first"
        if r.get("introduces_error"):
            verdict += " +intro"
        style = "bold white on red" if is_first else ("red" if not r["passed"] else None)
        t.add_row(key, verdict, _fmt(m.get("max_abs_error")), _fmt(m.get("rel_l2_error")),
                  _fmt(m.get("mismatch_percent"), 1) if m.get("mismatch_percent") else "0",
                  _fmt((r.get("introduced") or {}).get("max_abs_error")),
                  _fmt((r.get("carried_in") or {}).get("max_abs_error")), style=style)
    if len(shown) < len(rows):
        t.caption = f"{len(rows) - len(shown)} passing checkpoints not shown (--verbose shows all)"
    return t


def _write_output(path: Path, engine: Any, session_id: str, result: dict[str, Any]) -> None:
    """The HTML report (error curves, heatmap) for ``.html``/``.htm``, else the result JSON; atomic."""
    from ..errors import ValidationError
    from ..comparison import dumps_json
    from ..models._common import write_text_atomic
    from ..models.validation_report import ValidationReport
    from ..reports import render_report

    if path.suffix.lower() in (".html", ".htm"):
        text = render_report(ValidationReport.from_session(session_id, engine.db), "html")
    else:
        text = dumps_json(result)
    try:
        write_text_atomic(path.expanduser(), text)
    except OSError as exc:
        raise ValidationError(f"cannot write the output file: {exc}", file=str(path), session=session_id,
                              hint="choose a writable --output-file; the session is stored, "
                                   "session_report --session-id can write its report") from exc


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv``, validate, print; returns the exit code."""
    args = build_parser().parse_args(argv)
    out = Console(stderr=args.json)
    if not out.is_terminal:
        out = Console(stderr=args.json, width=120)  # logs and pipes: do not squeeze the table to 80 columns
    err = Console(stderr=True)
    from .. import get_framework_config
    from ..errors import DebugFrameworkError
    from ..comparison import dumps_json

    try:
        fw = get_framework_config()  # PIE_DEBUG_* read here, at the edge
        if args.database:
            fw["database_path"] = args.database
        from ..services.validation_engine import ValidationEngine

        engine = ValidationEngine(config=fw)
        cfg = _session_config(args)
        sid = engine.create_session(args.model_path, cfg, args.reference_backend, args.alternative_backend)
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as bar:
            task = bar.add_task("loading model", total=None)

            def progress(stage: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=f"{stage} done")

            result = engine.run(sid, progress=progress).to_dict()
        if args.output_file is not None:
            _write_output(args.output_file, engine, sid, result)
    except DebugFrameworkError as exc:
        if args.json:
            print(dumps_json({"status": "error", "error": exc.to_dict()}))
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE

    if args.json:
        print(dumps_json(result))
    else:
        out.print(_table(result, args.verbose))
        first = result.get("first_divergence")
        if first:
            out.print(f"[bold red]FAILED[/]: first divergence at [bold]{first['checkpoint']}"
                      f"{'' if first['layer'] is None else ' layer ' + str(first['layer'])}[/] "
                      f"(max abs error {_fmt(first.get('max_abs_error'))}; {first.get('reason') or ''})")
        else:
            out.print(f"[bold green]PASSED[/]: {len(result['results'])} checkpoints within tolerance")
        if result.get("introducing_layers") is not None:
            layers = result["introducing_layers"]
            out.print("isolation: " + (f"layer(s) {', '.join(map(str, layers))} introduce error; the rest only propagate"
                                       if layers else "no layer introduces error on its own"))
        elif result.get("isolation_note"):
            out.print(f"isolation: {result['isolation_note']}")
        perf = result.get("performance") or {}
        if "reference" in perf and "alternative" in perf:
            out.print(f"time: reference {perf['reference']['wall_s']:.3f} s, alternative {perf['alternative']['wall_s']:.3f} s")
        out.print(f"session {sid} in {engine.database_path}"
                  + (f"; wrote {args.output_file}" if args.output_file else ""))
    return EXIT_PASS if result["verdict"] == "passed" else EXIT_FAIL


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    raise SystemExit(run(argv))


if __name__ == "__main__":
    main()
