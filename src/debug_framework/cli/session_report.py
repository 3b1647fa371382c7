"""``session_report``: reports of stored validation sessions, the session list, and session diffs.

    session_report --session-id ID [--output-format json|html|csv|junit] [--output-file PATH]
                   [--include-tensors] [--database PATH] [--model-explorer DIR]
    session_report --list [--json] [--limit N] [--status STATUS] [--model-path PATH]
    session_report --diff BEFORE AFTER [--output-format json|html|csv] [--output-file PATH]
                   [--rel-change 0.1] [--abs-floor 0] [--atol-fraction 0.1] [--allow-different-models]
    session_report --maintenance [--dry-run] [--older-than DAYS] [--json]

Exit codes (:mod:`debug_framework.cli.framework`): 0 the command did what was asked (a report of a
*failed* session is still exit 0; gate CI on ``debug_validate``'s exit code or on the JUnit file);
1 ``--diff`` found at least one checkpoint that got worse; 2 usage or environment error (unknown
session id: DF003, database missing/unreadable: DF003, sessions not comparable: DF005); 3 internal
error (a bug; the traceback is in the crash log the message names).

``--model-explorer DIR`` (with ``--session-id``) writes the session's checkpoint graph, each drilled
layer's operator graph and their error as Model Explorer node data into DIR (docs/model_explorer.md);
alone it writes only those files, with ``--output-format``/``--output-file`` the report as well.

The database is ``--database``, else ``PIE_DEBUG_DATABASE``, else ``~/.pie/debug/debug_framework.db``.
It is only read (opened read-only: no switch to WAL, no migration; an older file is read through a
migrated temporary copy): a missing file is an error, never created. The exception is ``--maintenance``,
which sweeps abandoned sessions, deletes sessions past the retention period with their files, removes
orphaned inputs and tensor files and optimises the database (``--dry-run`` lists it all and changes
nothing; see docs/storage.md, "Maintenance").
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..checkpoint_ids import checkpoint_id
from ..errors import ConfigurationError, DatabaseError
from ..jsonio import JsonObject, JsonValue
from ..safefiles import check_output_path, is_stdout
from ..storage.schema import SESSION_STATUSES
from ..report_formats import DIFF_FORMATS, REPORT_FORMATS
from ..suggest import did_you_mean, one_of
from ..termtext import terminal_safe
from .framework import (EXIT_FAIL, EXIT_PASS, EXIT_USAGE, CliError, Invocation, add_row, literal, make_app, make_console,
                        print_json, run_app)
from .tables import Column, fitted_table

if TYPE_CHECKING:
    from rich.console import Console

    from ..storage.database import Database
    from ..services.session_diff import SessionDiff

__all__ = ["main", "app", "EXIT_OK", "EXIT_WORSE", "EXIT_USAGE"]

PROG = "session_report"
EXIT_OK, EXIT_WORSE = EXIT_PASS, EXIT_FAIL
_WIDE = 200  # piped output (CI logs, files) gets a wide table rather than 80 columns of folded ids

_HELP = "Reports of stored validation sessions (json, html, csv, junit), the session list, and diffs."
#: What exit code 1 means here (the table of every code ends the help: framework.EXIT_CODES_HELP).
_EPILOG = ("A report of a failed session is still exit 0; 1 is only --diff finding a checkpoint that got worse.")
app = make_app(_HELP, epilog=_EPILOG)


def _database_path(arg: str | None) -> Path | str:
    """The database file (``~`` expanded), or a ``postgresql://`` URL as given."""
    from ..config import default_database_path, from_environment, merge_config

    if arg is not None:
        return default_database_path({"database_path": arg})
    return default_database_path(merge_config(from_environment()))


def _open_db(path: Path | str) -> Database:
    """The database, opened read-only: a report never changes the file (nor migrates it; an older
    file is read through a migrated temporary copy)."""
    from ..storage.database import Database

    _require_db_file(path)
    return Database.open_read_only(path)


def _require_db_file(path: Path | str) -> None:
    """A missing database is an error: no command of this CLI creates one (a server URL is checked
    when it connects)."""
    if isinstance(path, Path) and not path.is_file():
        raise DatabaseError("no session database at this path", database=str(path),
                            hint="pass --database PATH (or set PIE_DEBUG_DATABASE) to the file debug_validate wrote")


def _write(text: str, out: Path | None) -> None:
    from ..models._common import write_report_file

    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    write_report_file(out.expanduser(), text, hint="choose a writable --output-file",
                      option="--output-file")


def _cmd_report(db: Database, session_id: str, fmt: str, output_file: Path | None, include_tensors: bool,
                tensor_store: Path | None) -> int:
    from ..models.validation_report import ValidationReport
    from ..reports import render_report
    from ..storage.tensor_store import TensorStore

    report = ValidationReport.from_session(session_id, db)
    store = None
    if tensor_store is not None:
        if not tensor_store.is_dir():
            raise DatabaseError("no tensor store at this path", path=str(tensor_store),
                                hint="omit --tensor-store to use the one beside the database")
        store = TensorStore(tensor_store, tensor_recording_limit=None)
    if include_tensors and fmt in ("csv", "junit"):
        print(f"{PROG}: note: --include-tensors has no effect on {fmt} output (use json or html)", file=sys.stderr)
    _write(render_report(report, fmt, include_tensors=include_tensors, store=store), output_file)
    if output_file is not None and not is_stdout(output_file):
        print(terminal_safe(f"wrote the {fmt} report of session {session_id} ({report.overall_status}) to "
                            f"{output_file}"), file=sys.stderr)
    return EXIT_OK


def _cmd_model_explorer(db: Database, session_id: str, out_dir: Path) -> None:
    """``--model-explorer DIR``: the session's Model Explorer graphs and node data (on stderr: where)."""
    from ..models.validation_report import ValidationReport
    from ..reports.model_explorer import write_session_model_explorer

    manifest = write_session_model_explorer(ValidationReport.from_session(session_id, db), out_dir)
    print(terminal_safe(f"wrote {len(manifest['graphs'])} Model Explorer graph(s) with node data to {out_dir} "
                        f"(open: {manifest['graphs'][0]['command']})"), file=sys.stderr)


def _session_items(db: Database, status: str | None, model_path: str | None, limit: int) -> list[JsonObject]:
    """The ``--list`` rows: one summary per session, newest first."""
    from ..reports._common import verdict_of
    from ..storage.session_record import SessionRecord

    items = []
    for row in db.sessions.list(status=status, model_path=model_path, limit=limit):
        s = SessionRecord.from_row(row)
        items.append({
            "session_id": s.session_id, "created_at": s.created_at, "status": s.status,
            "verdict": verdict_of(s), "model_path": s.model_path,
            "reference_backend": s.reference_backend, "alternative_backend": s.alternative_backend,
            **_dtypes(s.config),
            "first_divergence": _first_divergence(s.results.get("first_divergence")),
        })
    return items


def _first_divergence(ref: JsonValue) -> JsonObject | None:
    """The ``first_divergence`` of a session's stored summary as the list shows it: its ``id``,
    ``checkpoint`` and ``layer``, and ``step`` for a decode step (None: none)."""
    if not isinstance(ref, dict) or not ref.get("checkpoint"):
        return None
    layer, step = ref.get("layer"), ref.get("step")
    entry: JsonObject = {"id": checkpoint_id(str(ref["checkpoint"]), layer if isinstance(layer, int) else None,
                                             step if isinstance(step, int) else None),
                         "checkpoint": ref["checkpoint"], "layer": layer}
    if isinstance(step, int):
        entry["step"] = step
    return entry


def _dtypes(config: JsonObject) -> dict[str, str | None]:
    """The session's compute dtypes (alternative, reference) from its config; None where not recorded."""
    alt, ref = config.get("dtype"), config.get("reference_dtype")
    return {"dtype": None if alt is None else str(alt), "reference_dtype": None if ref is None else str(ref)}


def _dtype_cell(item: JsonObject) -> str:
    """``float32``, or ``float64 vs float32`` when the reference ran at another precision."""
    alt, ref = item.get("dtype"), item.get("reference_dtype")
    if ref and alt and ref != alt:
        return f"{ref} vs {alt}"
    return str(alt or ref or "")


def _where(db: Database) -> str:
    """How to name the database to a person: the file read (the original of a migrated copy), or
    the server URL without its password."""
    return db.location if db.location != str(db.database_path) else str(db.source_path)


#: The session list's columns: the id is never cut or left out; on a narrow terminal the lowest
#: ``keep`` goes first (when created, then the backends, then the first divergence), so the status,
#: model and dtype stay (a bfloat16 and a float32 run of one model never look the same).
_LIST_COLUMNS = (Column("session", key=True), Column("created (UTC)", number=True, left=True, keep=1),
                 Column("status", min_width=6), Column("model", min_width=12, keep=4),
                 Column("reference vs alternative", min_width=12, keep=2), Column("dtype", min_width=8, keep=5),
                 Column("first divergence", min_width=12, keep=3))


def _cmd_list(db: Database, items: list[JsonObject], as_json: bool) -> int:
    if as_json:
        print_json(items)
        return EXIT_OK
    if not items:
        print(terminal_safe(f"no sessions in {_where(db)}"))
        return EXIT_OK
    colours = {"passed": "green", "failed": "red", "error": "magenta", "running": "yellow"}
    rows = [[it["session_id"], str(it["created_at"] or "")[:19], str(it["status"]), str(it["model_path"]),
             f"{it['reference_backend']}\nvs {it['alternative_backend']}", _dtype_cell(it),
             "" if it["first_divergence"] is None else it["first_divergence"]["id"]] for it in items]
    console = make_console(piped_width=_WIDE)
    table = fitted_table(f"Sessions in {_where(db)}", _LIST_COLUMNS, rows, console.width,
                         styles=[colours.get(str(it["status"])) for it in items])
    console.print(table)
    return EXIT_OK



#: The flags of --diff, named in diff_sessions' messages instead of its Python keywords.
_DIFF_FLAGS = {"rel_change": "--rel-change", "abs_floor": "--abs-floor", "atol_fraction": "--atol-fraction",
               "require_same_model": "--allow-different-models"}


def _print_differences(console: Console, diff: SessionDiff) -> None:
    """What else differs between the sessions, one leaf per row (never a raw dict)."""
    from rich.table import Table

    from ..services.session_diff import value_text

    table = Table(title="What differs between the runs")
    for col in ("field", "before", "after"):
        table.add_column(col, overflow="fold")
    for d in diff.differences:
        add_row(table, d.field, value_text(d.before, 120), value_text(d.after, 120))
    console.print(table)


#: The diff table's columns.
_DIFF_COLUMNS = (Column("checkpoint", min_width=16), Column("layer", number=True, keep=1),
                 Column("before", min_width=6), Column("after", min_width=6),
                 Column("before max abs", number=True), Column("after max abs", number=True),
                 Column("change", min_width=7))


def _print_diff_table(diff: SessionDiff, before: str, after: str) -> None:
    from ..reports._common import fmt_num

    styles = {"worse": "bold red", "better": "green", "new": "cyan", "missing": "yellow"}
    rows = [[c.id, fmt_num(c.layer), _pass_label(c.before_passed), _pass_label(c.after_passed),
             fmt_num(c.before_max_abs_error), fmt_num(c.after_max_abs_error), c.change] for c in diff.changes]
    console = make_console(piped_width=_WIDE)
    table = fitted_table(f"{before} -> {after}", _DIFF_COLUMNS, rows, console.width,
                         styles=[styles.get(c.change) for c in diff.changes])
    console.print(table)
    if diff.differences:
        _print_differences(console, diff)
    console.print(literal(", ".join(f"{k}: {v}" for k, v in diff.to_dict()["counts"].items())))


def _pass_label(passed: bool | None) -> str:
    return "" if passed is None else ("pass" if passed else "FAIL")


def _cmd_diff(db: Database, before: str, after: str, fmt: str | None, output_file: Path | None, as_json: bool,
              thresholds: dict[str, float], allow_different_models: bool) -> int:
    from ..reports import render_diff
    from ..services.session_diff import diff_sessions

    diff = diff_sessions(before, after, db, **thresholds, require_same_model=not allow_different_models,
                         option_names=_DIFF_FLAGS)
    if fmt is None and (as_json or output_file is not None):
        fmt = "json"
    if fmt is not None:
        if fmt not in DIFF_FORMATS:
            raise ConfigurationError(f"--diff cannot be written as {fmt}", hint=f"use one of {', '.join(DIFF_FORMATS)}")
        _write(render_diff(diff, fmt, db=db), output_file)
    else:
        _print_diff_table(diff, before, after)
    worse = len(diff.worse)
    print(f"{worse} checkpoint(s) got worse" if worse else "nothing got worse", file=sys.stderr)
    return EXIT_WORSE if worse else EXIT_OK


def _one_mode(session_id: str | None, list_: bool, diff: tuple[str, str] | None, maintenance: bool = False) -> None:
    given = [name for name, on in (("--session-id", session_id is not None), ("--list", list_),
                                   ("--diff", diff is not None), ("--maintenance", maintenance)) if on]
    if len(given) != 1:
        raise CliError("give exactly one of --session-id, --list, --diff, --maintenance"
                       + (f" (got {', '.join(given)})" if given else ""), hint=f"{PROG} --help lists the options")


def _cmd_maintenance(path: Path | str, dry_run: bool, older_than: float | None, as_json: bool,
                     tensor_store: Path | None) -> int:
    """``--maintenance``: one maintenance pass (the only command here that writes)."""
    from ..config import from_environment, merge_config
    from ..services.maintenance import run_maintenance

    _require_db_file(path)  # maintenance never creates a database
    report = run_maintenance(path, dry_run=dry_run, older_than_days=older_than,
                             config=merge_config(from_environment()), tensor_store=tensor_store)
    if as_json:
        print_json(report.to_dict())
    else:
        console = make_console(piped_width=_WIDE)
        for line in report.lines():
            console.print(literal(line))
    return EXIT_OK


@app.command(help=_HELP, epilog=_EPILOG)
def report(
    ctx: typer.Context,
    session_id: str | None = typer.Option(None, "--session-id", help="session to report on"),
    list_: bool = typer.Option(False, "--list", help="list sessions, newest first"),
    diff: tuple[str, str] | None = typer.Option(None, "--diff", metavar="BEFORE AFTER",
                                                help="diff two sessions of the same model/backends"),
    output_format: str | None = typer.Option(None, "-f", "--output-format", metavar="[json|html|csv|junit]",
                                             help="report format (default: json); --diff accepts json, html, csv "
                                                  "(default: a table)"),
    output_file: Path | None = typer.Option(None, "-o", "--output-file", help="write here instead of stdout"),
    include_tensors: bool = typer.Option(False, "--include-tensors", help="include recorded tensors (statistics and "
                                         "values) from the tensor store (json, html)"),
    database: str | None = typer.Option(None, "--database", help="SQLite database file or postgresql:// URL "
                                        "(default: PIE_DEBUG_DATABASE or ~/.pie/debug/debug_framework.db)"),
    tensor_store: Path | None = typer.Option(None, "--tensor-store", help="tensor store root (default: <db dir>/<db "
                                             "name>_tensors)"),
    as_json: bool = typer.Option(False, "--json", help="with --list (or a --diff without --output-format): JSON on stdout"),
    limit: int = typer.Option(50, "--limit", min=1, help="with --list: at most this many sessions"),
    status: str | None = typer.Option(None, "--status", help="with --list: only sessions with this status"),
    model_path: str | None = typer.Option(None, "--model-path", help="with --list: only sessions of this model path"),
    rel_change: float = typer.Option(0.10, "--rel-change", help="with --diff: relative change that counts"),
    abs_floor: float = typer.Option(0.0, "--abs-floor", help="with --diff: ignore changes smaller than this"),
    atol_fraction: float = typer.Option(0.1, "--atol-fraction", help="with --diff: ignore changes smaller than this "
                                        "fraction of the checkpoint's absolute tolerance (default: 0.1)"),
    allow_different_models: bool = typer.Option(False, "--allow-different-models",
                                                help="with --diff: allow different model/backends"),
    model_explorer: Path | None = typer.Option(None, "--model-explorer", metavar="DIR",
                                               help="with --session-id: also write the checkpoint graph, drilled "
                                                    "layers' graphs and their error as Model Explorer node data "
                                                    "into DIR (docs/model_explorer.md)"),
    maintenance: bool = typer.Option(False, "--maintenance", help="sweep abandoned sessions, apply the retention "
                                     "policy, remove orphaned inputs and tensor files, optimise the database"),
    dry_run: bool = typer.Option(False, "--dry-run", help="with --maintenance: list what would go, change nothing"),
    older_than: float | None = typer.Option(None, "--older-than", metavar="DAYS", min=0.0,
                                            help="with --maintenance: delete finished sessions older than DAYS "
                                                 "(default: config retention_days; none: keep everything)"),
) -> int:
    """Write a session's report, list the sessions, or diff two sessions; returns the exit code."""
    invocation: Invocation = ctx.obj
    invocation.as_json = as_json
    _one_mode(session_id, list_, diff, maintenance)
    if model_explorer is not None and session_id is None:
        raise CliError("--model-explorer goes with --session-id", hint=f"{PROG} --session-id ID --model-explorer DIR")
    if not maintenance and (dry_run or older_than is not None):
        raise CliError("--dry-run and --older-than go with --maintenance", hint=f"{PROG} --maintenance --dry-run")
    if output_format is not None and output_format not in REPORT_FORMATS:
        raise CliError(f"--output-format {output_format!r} is not one of {', '.join(REPORT_FORMATS)}"
                       + did_you_mean(output_format, REPORT_FORMATS))
    if status is not None and status not in SESSION_STATUSES:
        raise CliError(f"--status {status!r} is not a session status" + did_you_mean(status, SESSION_STATUSES),
                       hint=one_of(SESSION_STATUSES))
    if output_file is not None and not is_stdout(output_file):
        check_output_path(output_file)  # a FIFO, device or symlink is refused before any work
    path = _database_path(database)
    invocation.database = path if isinstance(path, Path) else None
    if maintenance:
        return _cmd_maintenance(path, dry_run, older_than, as_json, tensor_store)
    db = _open_db(path)
    if list_:
        return _cmd_list(db, _session_items(db, status, model_path, limit), as_json)
    if diff is not None:
        thresholds = {"rel_change": rel_change, "abs_floor": abs_floor, "atol_fraction": atol_fraction}
        return _cmd_diff(db, diff[0], diff[1], output_format, output_file, as_json, thresholds,
                         allow_different_models)
    assert session_id is not None
    if model_explorer is not None:
        _cmd_model_explorer(db, session_id, model_explorer)
        if output_format is None and output_file is None:  # only the Model Explorer files were asked for
            return EXIT_OK
    return _cmd_report(db, session_id, output_format or "json", output_file, include_tensors, tensor_store)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (console script and ``python -m``): returns the exit code."""
    return run_app(app, Invocation(PROG), argv)


if __name__ == "__main__":
    sys.exit(main())
