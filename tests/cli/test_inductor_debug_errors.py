"""``inductor-debug`` in process: a bug of ours exits 3 (one line naming the crash log, no traceback on
stderr), an error in the user's model exits 2, usage errors exit 2, and user text prints literally."""

from __future__ import annotations

import textwrap

import pytest

from debug_framework.cli.framework import LOG_DIR_VARIABLE
from debug_module.cli import main

from .conftest import check_json

EVIL = "[red]x[/red] :smile:"


def _main(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return int(exit_info.value.code)


@pytest.fixture
def log_dir(tmp_path, monkeypatch):
    path = tmp_path / "logs"
    monkeypatch.setenv(LOG_DIR_VARIABLE, str(path))
    return path


def test_internal_error_exits_3_with_the_traceback_in_the_log(tmp_path, monkeypatch, capsys, log_dir):
    import debug_module.reports as reports

    def broken_find_runs(root):
        raise RuntimeError("find_runs broke")

    monkeypatch.setattr(reports, "find_runs", broken_find_runs)
    assert _main("--root", str(tmp_path), "list") == 3
    cap = capsys.readouterr()
    assert cap.out == "" and "Traceback" not in cap.err
    (line,) = cap.err.splitlines()
    (log,) = log_dir.glob("inductor-debug-*.log")
    assert "internal error" in line and "RuntimeError: find_runs broke" in line and str(log) in line
    assert "broken_find_runs" in log.read_text() and "Traceback (most recent call last)" in log.read_text()

    assert _main("--root", str(tmp_path), "--json", "list") == 3
    cap = capsys.readouterr()
    doc = check_json(cap.out)  # the documented schema covers exit 3
    assert doc["exit_code"] == 3 and doc["ok"] is False and doc["data"] is None and doc["command"] == "list"
    assert doc["error"]["type"] == "internal" and "traceback is in" in doc["error"]["hint"]
    assert "Traceback" not in cap.err


def test_an_error_in_the_users_model_is_the_environment(tmp_path, monkeypatch, capsys, log_dir):
    (tmp_path / "broken_model.py").write_text(textwrap.dedent("""
        def make_model():
            raise ValueError("the user's factory failed")
    """))
    monkeypatch.chdir(tmp_path)
    assert _main("--root", str(tmp_path / "art"), "--json", "diff", "--model", "broken_model.py:make_model") == 2
    cap = capsys.readouterr()
    doc = check_json(cap.out)
    assert doc["error"]["type"] == "environment" and "the user's factory failed" in doc["error"]["message"]
    assert "Traceback" not in cap.err and not log_dir.exists()


def test_usage_errors_exit_2(tmp_path, capsys):
    assert _main("--root", str(tmp_path), "analyze", "--type", "bogus") == 2
    assert "unknown analysis type" in capsys.readouterr().err
    assert _main("no-such-command") == 2
    assert _main("diff", "--runs", "0") == 2
    assert "Traceback" not in capsys.readouterr().err


def test_user_text_prints_literally(tmp_path, capsys, monkeypatch):
    from debug_module.artifacts import RunDirectory

    monkeypatch.setenv("COLUMNS", "300")
    root = tmp_path / EVIL
    run = RunDirectory(root, backend="[bold]backend[/bold]")
    run.set_status("complete", model=EVIL)
    assert _main("--root", str(root), "list") == 0
    out = capsys.readouterr().out
    assert f"runs under {root}" in out and EVIL in out and "[bold]backend[/bold]" in out
    assert _main("--root", str(root), "analyze", "--type", "summary") == 0
    out = capsys.readouterr().out
    assert f"summary of run {run.path.name} ({EVIL})" in out


def test_runs_of_the_same_second_are_ordered_by_their_creation_time(tmp_path):
    """Run ids carry the second and a random suffix: two runs made in one second sort by the
    manifest's creation time, not by the suffix (the dashboard's "newest run" relied on it)."""
    import json

    from debug_module.reports.generator import find_runs

    for run_id, created in (("20261123T081300-ffffffff", "2026-11-23T08:13:00.100000+00:00"),
                            ("20261123T081300-00000000", "2026-11-23T08:13:00.900000+00:00")):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "manifest.json").write_text(json.dumps(
            {"schema": "debug_module.run/1", "run_id": run_id, "created": created, "artifacts": []}))
    assert [p.name for p in find_runs(tmp_path)] == ["20261123T081300-ffffffff", "20261123T081300-00000000"]
