"""``session_report``: reports of stored validation sessions, the session list, and session diffs.

    session_report --session-id ID [--output-format json|html|csv|junit] [--output-file PATH]
                   [--include-tensors] [--database PATH]
    session_report --list [--json] [--limit N] [--status STATUS] [--model-path PATH]
    session_report --diff BEFORE AFTER [--output-format json|html|csv] [--output-file PATH]
                   [--rel-change 0.1] [--abs-floor 0] [--allow-different-models]

Exit codes: 0 the command did what was asked (a report of a *failed* session is still exit 0;
gate CI on ``debug_validate``'s exit code or on the JUnit file); 1 ``--diff`` found at least one
checkpoint that got worse; 2 usage or environment error (unknown session id: DF003, database
missing/unreadable: DF003, sessions not comparable: DF005).

The database is ``--database``, else ``PIE_DEBUG_DATABASE``, else ``~/.pie/debug/debug_framework.db``.
It is only read: a missing file is an error, never created.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import DatabaseError, DebugFrameworkError, ValidationError
from ..comparison import dumps_json
from ..models._common import write_text_atomic

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_WORSE", "EXIT_USAGE"]

EXIT_OK, EXIT_WORSE, EXIT_USAGE = 0, 1, 2
_FORMATS = ("json", "html", "csv", "junit")
_DIFF_FORMATS = ("json", "html", "csv")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="session_report",
        description="Reports of stored validation sessions (json, html, csv, junit), the session list, and diffs.",
        epilog="Exit codes: 0 ok; 1 --diff found a checkpoint that got worse; 2 usage or environment error.",
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--session-id", help="session to report on")
    mode.add_argument("--list", action="store_true", help="list sessions, newest first")
    mode.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="diff two sessions of the same model/backends")
    p.add_argument("--output-format", choices=_FORMATS, default=None,
                   help="report format (default json); --diff accepts json, html, csv (default: a table)")
    p.add_argument("--output-file", type=Path, help="write here instead of stdout")
    p.add_argument("--include-tensors", action="store_true",
                   help="include recorded tensors (statistics and values) from the tensor store (json, html)")
    p.add_argument("--database", type=Path, help="SQLite database (default: PIE_DEBUG_DATABASE or ~/.pie/debug/debug_framework.db)")
    p.add_argument("--tensor-store", type=Path, help="tensor store root (default: <db dir>/<db name>_tensors)")
    p.add_argument("--json", action="store_true", help="with --list (or a --diff without --output-format): JSON on stdout")
    p.add_argument("--limit", type=int, default=50, help="with --list: at most this many sessions (default 50)")
    p.add_argument("--status", help="with --list: only sessions with this status")
    p.add_argument("--model-path", help="with --list: only sessions of this model path")
    p.add_argument("--rel-change", type=float, default=0.10, help="with --diff: relative change that counts (default 0.10)")
    p.add_argument("--abs-floor", type=float, default=0.0, help="with --diff: ignore changes smaller than this")
    p.add_argument("--allow-different-models", action="store_true", help="with --diff: allow different model/backends")
    return p


def _database_path(arg: Path | None) -> Path:
    if arg is not None:
        return arg.expanduser()
    from ..config import default_database_path, from_environment, merge_config

    return default_database_path(merge_config(from_environment()))


def _open_db(path: Path) -> Any:
    from ..services.database_manager import DatabaseManager

    if not path.is_file():
        raise DatabaseError("no session database at this path", database=str(path),
                            hint="pass --database PATH (or set PIE_DEBUG_DATABASE) to the file debug_validate wrote")
    return DatabaseManager(path)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        if not text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        return
    path = out.expanduser()
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise ValidationError(f"cannot write the report: {exc}", file=str(path), hint="choose a writable --output-file")


def _fail(exc: DebugFrameworkError, as_json: bool) -> int:
    if as_json:
        print(dumps_json({"error": exc.to_dict()}))
    print(f"session_report: {exc}", file=sys.stderr)
    return EXIT_USAGE


def _console() -> Any:
    from rich.console import Console

    # piped output (CI logs, files) gets a wide table rather than 80 columns of folded ids
    return Console() if sys.stdout.isatty() else Console(width=200)


def _cmd_report(args: argparse.Namespace, db: Any) -> int:
    from ..models.validation_report import ValidationReport
    from ..reports import render_report
    from ..services.tensor_store import TensorStore

    fmt = args.output_format or "json"
    report = ValidationReport.from_session(args.session_id, db)
    store = None
    if args.tensor_store is not None:
        if not args.tensor_store.is_dir():
            raise DatabaseError("no tensor store at this path", path=str(args.tensor_store),
                                hint="omit --tensor-store to use the one beside the database")
        store = TensorStore(args.tensor_store, tensor_recording_limit=None)
    if args.include_tensors and fmt in ("csv", "junit"):
        print(f"session_report: note: --include-tensors has no effect on {fmt} output (use json or html)",
              file=sys.stderr)
    text = render_report(report, fmt, include_tensors=args.include_tensors, store=store)
    _write(text, args.output_file)
    if args.output_file is not None:
        print(f"wrote the {fmt} report of session {args.session_id} ({report.overall_status}) to {args.output_file}",
              file=sys.stderr)
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, db: Any) -> int:
    from ..reports._common import first_divergence_key, row_label, session_results, verdict_of

    sessions = db.list_sessions(status=args.status, model_path=args.model_path, limit=args.limit)
    items = []
    for s in sessions:
        res = session_results(s)
        key = first_divergence_key([], res)
        items.append({
            "session_id": s["session_id"], "created_at": s.get("created_at"), "status": s.get("status"),
            "verdict": verdict_of(s.get("status"), res), "model_path": s.get("model_path"),
            "reference_backend": s.get("reference_backend"), "alternative_backend": s.get("alternative_backend"),
            "first_divergence": None if key is None else {"checkpoint": key[0], "layer": key[1]},
        })
    if args.json:
        print(dumps_json(items))
        return EXIT_OK
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"Sessions in {db.database_path}", show_lines=False)
    table.add_column("session", no_wrap=True)
    for col in ("created (UTC)", "status", "model", "reference vs alternative", "first divergence"):
        table.add_column(col, overflow="fold")
    colours = {"passed": "green", "failed": "red", "error": "magenta", "running": "yellow"}
    for it in items:
        fd = it["first_divergence"]
        table.add_row(
            Text(str(it["session_id"])), Text(str(it["created_at"] or "")[:19]),
            Text(str(it["status"]), style=colours.get(str(it["status"]), "")),
            Text(str(it["model_path"])),
            Text(f"{it['reference_backend']} vs {it['alternative_backend']}"),
            Text("" if fd is None else row_label((fd["checkpoint"], fd["layer"]))),
        )
    if items:
        _console().print(table)
    else:
        print(f"no sessions in {db.database_path}")
    return EXIT_OK


def _cmd_diff(args: argparse.Namespace, db: Any) -> int:
    from ..reports import render_diff
    from ..services.session_diff import diff_sessions

    before, after = args.diff
    diff = diff_sessions(before, after, db, rel_change=args.rel_change, abs_floor=args.abs_floor,
                         require_same_model=not args.allow_different_models)
    worse = len(diff.worse)
    fmt = args.output_format
    if fmt is None and (args.json or args.output_file is not None):
        fmt = "json"
    if fmt is not None:
        if fmt not in _DIFF_FORMATS:
            raise ValidationError(f"--diff cannot be written as {fmt}", hint=f"use one of {', '.join(_DIFF_FORMATS)}")
        _write(render_diff(diff, fmt, db=db), args.output_file)
    else:
        from rich.table import Table
        from rich.text import Text

        from ..reports._common import fmt_num

        table = Table(title=f"{before} -> {after}")
        for col in ("checkpoint", "layer", "before", "after", "before max abs", "after max abs", "change"):
            table.add_column(col)
        styles = {"worse": "bold red", "better": "green", "new": "cyan", "missing": "yellow"}
        pv = lambda p: "" if p is None else ("pass" if p else "FAIL")  # noqa: E731
        for c in diff.changes:
            table.add_row(Text(c.checkpoint), fmt_num(c.layer), pv(c.before_passed), pv(c.after_passed),
                          fmt_num(c.before_max_abs_error), fmt_num(c.after_max_abs_error),
                          Text(c.change, style=styles.get(c.change, "")))
        console = _console()
        console.print(table)
        for note in diff.notes:
            console.print(Text(f"note: {note}"))
        counts = diff.to_dict()["counts"]
        console.print(Text(", ".join(f"{k}: {v}" for k, v in counts.items())))
    print(f"{worse} checkpoint(s) got worse" if worse else "nothing got worse", file=sys.stderr)
    return EXIT_WORSE if worse else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for usage errors, 0 for --help
        return int(exc.code or 0)
    if args.limit is not None and args.limit < 1:
        parser.print_usage(sys.stderr)
        print("session_report: error: --limit must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        db = _open_db(_database_path(args.database))
        if args.list:
            return _cmd_list(args, db)
        if args.diff:
            return _cmd_diff(args, db)
        return _cmd_report(args, db)
    except DebugFrameworkError as exc:
        return _fail(exc, bool(args.json))


if __name__ == "__main__":
    sys.exit(main())
