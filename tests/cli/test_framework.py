"""The shared CLI framework (debug_framework.cli.framework): exit codes 0/1/2/3, one-line failures, the crash
log, strict JSON, and user text that is never read as rich markup."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer

from debug_framework.cli import framework as fw
from debug_framework.errors import DatabaseError


def _app(behaviour):
    """A one-command app whose command runs ``behaviour()`` (returning an exit code or raising)."""
    app = fw.make_app("test app")

    @app.command()
    def cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json"),
            count: int = typer.Option(1, "--count", min=1)) -> int:
        ctx.obj.as_json = as_json
        return behaviour()

    return app


def _deep_failure():
    def level_two():
        raise RuntimeError("deep [red]boom[/red]\nsecond line")

    level_two()


@pytest.fixture(autouse=True)
def log_dir(tmp_path, monkeypatch):
    path = tmp_path / "logs"
    monkeypatch.setenv(fw.LOG_DIR_VARIABLE, str(path))
    return path


def test_exit_codes_pass_fail_and_usage(capsys):
    assert fw.run_app(_app(lambda: fw.EXIT_PASS), fw.Invocation("t"), []) == 0
    assert fw.run_app(_app(lambda: None), fw.Invocation("t"), []) == 0
    assert fw.run_app(_app(lambda: fw.EXIT_FAIL), fw.Invocation("t"), []) == 1
    capsys.readouterr()
    for argv in (["--no-such-option"], ["--count", "0"], ["--count", "x"]):
        assert fw.run_app(_app(lambda: 0), fw.Invocation("t"), argv) == 2, argv
        err = capsys.readouterr().err
        assert "Error:" in err and "Traceback" not in err and len(err.splitlines()) <= 4
    assert fw.run_app(_app(lambda: 0), fw.Invocation("t"), ["--help"]) == 0
    assert "--count" in capsys.readouterr().out


def test_ctrl_c_is_exit_130_with_one_line_naming_the_session(capsys, ctrl_c_raises):
    """typer turns a KeyboardInterrupt into a silent 130; run_app says what happened, in one line."""
    import os
    import signal
    import time

    def interrupted() -> int:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the signal arrives before this ends
        return 0

    inv = fw.Invocation("t")
    inv.session_id = "abc123"
    assert fw.run_app(_app(interrupted), inv, []) == fw.EXIT_INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err == "t: interrupted by the user (Ctrl-C); session abc123 is marked error (interrupted by the user)\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert fw.run_app(_app(lambda: 130), fw.Invocation("t"), []) == 130  # a command's own 130 is not an interrupt
    assert capsys.readouterr().err == ""


def test_framework_error_is_one_line_with_code_and_hint(capsys):
    def raise_df():
        raise DatabaseError("no session database at this path", database="/x.db", hint="pass --database")

    assert fw.run_app(_app(raise_df), fw.Invocation("tool"), []) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    (line,) = cap.err.splitlines()
    assert line.startswith("tool: [DF003]") and "database=/x.db" in line and "What to do: pass --database" in line
    assert fw.run_app(_app(raise_df), fw.Invocation("tool"), ["--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 2 and doc["error"]["code"] == "DF003" and doc["error"]["hint"] == "pass --database"


def test_cli_error_and_os_error_exit_2(capsys):
    def raise_cli():
        raise fw.CliError("unknown format 'pdf'", hint="use html or json")

    def raise_os():
        raise PermissionError(13, "Permission denied", "/ro/out.html")

    assert fw.run_app(_app(raise_cli), fw.Invocation("t"), []) == 2
    assert capsys.readouterr().err.strip() == "t: error: unknown format 'pdf'. What to do: use html or json"
    assert fw.run_app(_app(raise_os), fw.Invocation("t"), []) == 2
    err = capsys.readouterr().err
    assert "PermissionError" in err and "internal error" not in err


def test_internal_error_exits_3_with_one_line_and_the_traceback_in_the_log(capsys, log_dir):
    assert fw.run_app(_app(_deep_failure), fw.Invocation("tool"), ["--count", "2"]) == 3
    cap = capsys.readouterr()
    assert cap.out == "" and "Traceback" not in cap.err
    (line,) = cap.err.splitlines()
    assert "internal error" in line and "not a numerical failure" in line and "RuntimeError: deep" in line
    (log,) = log_dir.glob("tool-*.log")
    assert str(log) in line
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "level_two" in text and '"--count", "2"' in text


def test_internal_error_under_json_is_a_document_naming_the_log(capsys, log_dir):
    assert fw.run_app(_app(_deep_failure), fw.Invocation("tool"), ["--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 3 and doc["error"]["kind"] == "internal"
    assert Path(doc["error"]["log_file"]).parent == log_dir.resolve()


def test_crash_log_location(monkeypatch, tmp_path):
    monkeypatch.delenv(fw.LOG_DIR_VARIABLE)
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "db" / "sessions.db"))
    assert fw.crash_log_dir() == tmp_path / "db" / "logs"
    assert fw.crash_log_dir(tmp_path / "other" / "x.db") == tmp_path / "other" / "logs"
    monkeypatch.setenv("PIE_DEBUG_LEVEL", "NOT_A_LEVEL")  # a bad variable must not hide the crash
    assert fw.crash_log_dir().name == "pie-debug-logs"
    # an unwritable log dir falls back to the temp dir
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(fw.LOG_DIR_VARIABLE, str(blocker / "logs"))
    inv = fw.Invocation("fallback")
    try:
        raise RuntimeError("x")
    except RuntimeError as exc:
        path = fw.write_crash_log(inv, exc)
    assert path is not None and path.parent.name == "pie-debug-logs" and "RuntimeError" in path.read_text()
    path.unlink()


def test_the_crash_log_keeps_no_password(monkeypatch, tmp_path):
    monkeypatch.setenv(fw.LOG_DIR_VARIABLE, str(tmp_path / "logs"))
    inv = fw.Invocation("session_report")
    inv.argv = ["--database", "postgresql://bob:s3cret@db:5432/x?password=s3cret"]
    try:
        raise RuntimeError("connecting to postgresql://bob:s3cret@db:5432/x failed")
    except RuntimeError as exc:
        path = fw.write_crash_log(inv, exc)
    text = path.read_text()
    assert "s3cret" not in text and "postgresql://bob:***@db:5432/x" in text and "RuntimeError" in text


def test_user_text_is_never_markup():
    from rich.console import Console
    from rich.table import Table

    evil = "[red]x[/red] [bold]:smile:"
    console = Console(record=True, width=200, emoji=False)
    console.print(fw.markup("[bold]model[/bold] {}", evil))
    table = Table(title=fw.literal(evil))
    table.add_column("path")
    fw.add_row(table, evil)
    console.print(table)
    text = console.export_text()
    assert text.count(evil) == 3 and "model" in text and "[bold]model" not in text


def test_json_is_strict_and_the_projects_encoding():
    from debug_framework.comparison import dumps_json

    plain = {"b": [1, 2.5, None, True, "s"], "a": {"x": (1, 2)}}
    assert fw.dumps_json(plain) == dumps_json(plain)
    odd = {"nan": math.nan, "inf": -math.inf, 3: "int key", "path": Path("/p")}
    text = fw.dumps_json(odd)
    assert text == dumps_json(odd)
    assert json.loads(text) == {"nan": "NaN", "inf": "-Infinity", "3": "int key", "path": "/p"}
