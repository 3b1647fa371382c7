"""``debug_batch``: the batch form of ``debug_validate``: validate every model listed in a file as one
resumable :class:`~debug_framework.models.batch_validation_job.BatchValidationJob`.

    debug_batch models.txt --alternative-backend pytorch                       # local processes
    debug_batch models.txt --executor ray --ray-address 10.0.0.1:6379 --device cuda
    python -m debug_framework.cli.debug_batch models.txt --job-id nightly --json

The file lists one model path per line (blank lines and lines starting with ``#`` are skipped).
The job id defaults to one derived from the list, so running the same file again resumes the job
(what finished is kept, the rest runs). Exit codes: 0 every item validated and passed, 1 an item
failed (a numerical failure or an error of its own, see its row), 2 usage or environment error (a
model path that does not exist included: every path is checked before anything runs).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import typer

from ..jsonio import JsonObject, read_json_object
from .framework import (EXIT_FAIL, EXIT_PASS, CliError, Invocation, make_app, make_console, markup,
                        print_json, run_app, stdout_for_json_only)
from .tables import Column, fitted_table
from .user_code import load_backend_code
from .validate_support import check_database_path, check_dtype, check_model_path

__all__ = ["app", "main", "read_model_list", "outcome_counts"]

PROG = "debug_batch"
_HELP = ("Validate every model listed in a file (one path per line) as one resumable batch job, on local "
         "processes or a Ray cluster.")
app = make_app(_HELP)


def read_model_list(path: Path) -> list[str]:
    """The model paths of a list file: one per line; blank lines and ``#`` comments skipped.

    Raises:
        CliError: the file cannot be read, or lists no model.
    """
    try:
        text = path.read_bytes().decode("utf-8")  # bytes: no newline translation of a "\r" in a path
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the model list {str(path)!r}: {exc}", kind="environment") from exc
    # lines end at "\n" only: a path may hold any other character (U+2028 or a form feed included)
    models = [s for s in (line.strip(" \t\r") for line in text.split("\n")) if s and not s.startswith("#")]
    if not models:
        raise CliError(f"the model list {str(path)!r} names no model", hint="one model path per line")
    return models


def _job_config(options: JsonObject, config_file: Path | None) -> JsonObject:
    config = dict(read_json_object(config_file, "--config-file")) if config_file is not None else {}
    config.update({k: v for k, v in options.items() if v is not None})
    return config


@app.command(help=_HELP)
def batch(
    ctx: typer.Context,
    model_list: Path = typer.Argument(..., help="text file: one model path per line"),
    job_id: str | None = typer.Option(None, "--job-id", help="the job's id (default: derived from the list; "
                                      "the same id resumes the job)"),
    executor: str = typer.Option("local", "--executor", help="local (processes on this machine, default) or ray"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster address (default: "
                                           "RAY_ADDRESS, else a new local Ray instance)"),
    parallel: int = typer.Option(1, "--parallel", min=1, help="items at a time (local processes or Ray tasks)"),
    max_retries: int | None = typer.Option(None, "--max-retries", min=0,
                                           help="Ray: runs of an item after its worker died (default: 2)"),
    reference_backend: str = typer.Option("auto", "--reference-backend", help="as debug_validate's: "
                                          "python_reference where one exists, else float64_eager (default: auto)"),
    alternative_backend: str = typer.Option("auto", "--alternative-backend", help="backend name, as "
                                            "debug_validate's (default: auto)"),
    device: str | None = typer.Option(None, "--device", help="the alternative's device (cuda: one GPU per Ray task)"),
    isolate: bool | None = typer.Option(None, "--isolate/--no-isolate", help="per-layer isolation, or skip it"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="run failed items again"),
    config_file: Path | None = typer.Option(None, "--config-file", help="JSON file of job and session keys"),
    database: str | None = typer.Option(None, "--database", help="SQLite database file or postgresql:// URL"),
    backend_module: list[str] | None = typer.Option(None, "--backend-module", metavar="PKG.MOD",
                                                    help="import this module first (repeatable)"),
    backend_file: list[Path] | None = typer.Option(None, "--backend-file", metavar="PATH.py",
                                                   help="import this Python file first (repeatable): it registers "
                                                        "backends with register_backend(name, factory)"),
    dtype: str | None = typer.Option(None, "--dtype", help="the alternative's compute dtype (float32, float16, "
                                     "bfloat16, float64)"),
    drill_down: bool = typer.Option(False, "--drill-down", help="name the operator that introduces the error in "
                                    "each diverging layer (docs/drilldown.md)"),
    oracle: bool = typer.Option(False, "--oracle", help="judge by the ratio rule against a float64 python_reference"),
    as_json: bool = typer.Option(False, "--json", help="print the items as JSON on stdout (no table)"),
) -> int:
    """Run (or resume) the job, print one row per item, and return the exit code."""
    invocation: Invocation = ctx.obj
    invocation.as_json = as_json
    if executor not in ("local", "ray"):
        raise CliError(f"--executor must be local or ray, got {executor!r}")
    models = read_model_list(model_list)
    check_dtype("--dtype", dtype)
    for model in models:  # a path that does not exist is the user's (exit 2), before anything runs
        check_model_path(model)
    from .. import get_framework_config
    from ..config import default_database_path
    from ..models.batch_validation_job import BatchValidationJob
    from ..services.executors import execute_job

    fw = get_framework_config()
    if database:
        fw["database_path"] = database
    invocation.database = check_database_path(default_database_path(fw))
    # under --json, stdout carries only the JSON: user code's, Ray's and the workers' lines go to stderr
    with stdout_for_json_only(as_json):
        load_backend_code(backend_module or (), backend_file or ())
        config = _job_config({"executor": executor, "ray_address": ray_address, "max_retries": max_retries,
                              "reference_backend": reference_backend, "alternative_backend": alternative_backend,
                              "device": device, "isolate": isolate, "retry_failed": retry_failed or None,
                              "dtype": dtype, "drill_down": drill_down or None, "oracle": oracle or None,
                              "parallel_execution": parallel > 1 or None, "max_concurrent_jobs": parallel,
                              "show_progress": not as_json, "database_path": fw["database_path"]}, config_file)
        jid = job_id or "batch-" + hashlib.sha256("\n".join(models).encode()).hexdigest()[:16]
        results = execute_job(BatchValidationJob(jid, models, config))
    if as_json:
        print_json({"job_id": jid, "items": results})
    else:
        _print_table(jid, results)
    ok = all(r["status"] == "done" and r["verdict"] == "passed" for r in results)
    return EXIT_PASS if ok else EXIT_FAIL


#: The batch table's columns: the item index is never cut, the model path folds whole (never cut
#: to ``…``), and the error goes first when the terminal is narrow.
_COLUMNS = (Column("#", number=True), Column("model", min_width=20), Column("item", min_width=7),
            Column("verdict", min_width=7), Column("error", min_width=12, keep=1))


def _print_table(job_id: str, results: list[JsonObject]) -> None:
    rows = [[str(r["item_index"]), str(r["model_path"]), str(r["status"]), str(r["verdict"] or "-"),
             str(r["error"] or "")] for r in results]
    out = make_console()
    out.print(fitted_table(None, _COLUMNS, rows, out.width))
    out.print(markup("job {}: {} item(s): {}", job_id, len(results), outcome_counts(results)))


def outcome_counts(results: list[JsonObject]) -> str:
    """``3 passed, 1 failed, 1 error``: each item by its verdict, an item that did not finish
    (its own error, or not run yet) by its status."""
    counts: dict[str, int] = {}
    for r in results:
        key = r["verdict"] if r["status"] == "done" and r.get("verdict") else (
            "error" if r["status"] == "failed" else str(r["status"]))
        counts[key] = counts.get(key, 0) + 1
    order = ["passed", "failed", "error"]
    return ", ".join(f"{counts[k]} {k}" for k in [*order, *sorted(set(counts) - set(order))] if k in counts)


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and ``python -m``): runs the job; returns the exit code."""
    return run_app(app, Invocation(PROG), argv)


if __name__ == "__main__":
    sys.exit(main())
