"""``session_report``: formats, output files, --list, --diff, and exit codes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from debug_framework.cli.session_report import main


def test_report_formats_to_stdout_and_file(db, build, tmp_path, capsys):
    b = build(db, bug_layer=2)
    dbp = str(db.database_path)
    assert main(["--session-id", b.session_id, "--database", dbp]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_divergence"] == {"id": "post_mlp:2", "checkpoint": "post_mlp", "layer": 2}
    assert "tensors" not in doc
    assert main(["--session-id", b.session_id, "--database", dbp, "--include-tensors"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tensors"]) > 0
    assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "csv"]) == 0
    assert len(list(csv.DictReader(io.StringIO(capsys.readouterr().out)))) == len(b.results)
    out = tmp_path / "out" / "r.xml"
    assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "junit",
                 "--output-file", str(out), "--include-tensors"]) == 0
    err = capsys.readouterr().err
    assert "no effect on junit" in err and "wrote the junit report" in err
    assert ET.parse(out).getroot().find("testsuite").get("failures") == "4"
    html = tmp_path / "r.html"
    assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "html",
                 "--output-file", str(html), "--include-tensors"]) == 0
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'id="tensors"' in text and 'id="heatmap"' in text


def test_errors_exit_2_with_codes(db, build, tmp_path, capsys):
    b = build(db, bug_layer=None, record=False)
    dbp = str(db.database_path)
    assert main(["--session-id", "ghost", "--database", dbp]) == 2
    assert "[DF003]" in capsys.readouterr().err
    assert main(["--session-id", "ghost", "--database", str(tmp_path / "nope.db")]) == 2
    assert "no session database" in capsys.readouterr().err and not (tmp_path / "nope.db").exists()
    assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "pdf"]) == 2
    assert main(["--database", dbp]) == 2  # no mode
    assert main(["--list", "--diff", "a", "b", "--database", dbp]) == 2
    capsys.readouterr()
    assert main(["--list", "--json", "--database", str(tmp_path / "nope.db")]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "DF003"


def test_list(db, build, capsys):
    a = build(db, bug_layer=None, model_path="/models/a")
    b = build(db, bug_layer=1, model_path="/models/b")
    dbp = str(db.database_path)
    assert main(["--list", "--json", "--database", dbp]) == 0
    items = json.loads(capsys.readouterr().out)
    by_id = {i["session_id"]: i for i in items}
    assert set(by_id) == {a.session_id, b.session_id}
    assert by_id[b.session_id]["first_divergence"] == {"id": "post_mlp:1", "checkpoint": "post_mlp", "layer": 1}
    assert by_id[a.session_id]["status"] == "passed" and by_id[a.session_id]["first_divergence"] is None
    assert main(["--list", "--database", dbp, "--status", "failed"]) == 0
    out = capsys.readouterr().out
    assert b.session_id in out and a.session_id not in out and "post_mlp:1" in out


def test_diff_exit_codes(db, build, tmp_path, capsys):
    good = build(db, bug_layer=None, seed=0)
    good2 = build(db, bug_layer=None, seed=0)
    bad = build(db, bug_layer=2, seed=0)
    other = build(db, bug_layer=None, model_path="/models/other")
    dbp = str(db.database_path)
    assert main(["--diff", good.session_id, good2.session_id, "--database", dbp]) == 0
    assert "nothing got worse" in capsys.readouterr().err
    assert main(["--diff", good.session_id, bad.session_id, "--database", dbp]) == 1
    cap = capsys.readouterr()
    assert "worse" in cap.out and "got worse" in cap.err
    assert main(["--diff", bad.session_id, good.session_id, "--database", dbp, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["better"] > 0
    out = tmp_path / "diff.html"
    assert main(["--diff", good.session_id, bad.session_id, "--database", dbp, "--output-format", "html",
                 "--output-file", str(out)]) == 1
    assert '<tr class="worse">' in out.read_text()
    assert main(["--diff", good.session_id, other.session_id, "--database", dbp]) == 2
    assert "[DF005]" in capsys.readouterr().err
    assert main(["--diff", good.session_id, other.session_id, "--database", dbp, "--allow-different-models"]) in (0, 1)
    assert main(["--diff", good.session_id, bad.session_id, "--database", dbp, "--output-format", "junit"]) == 2


def test_module_entry_point_and_env_database(db, build, tmp_path):
    b = build(db, bug_layer=None, record=False)
    env = {**os.environ, "PIE_DEBUG_DATABASE": str(db.database_path)}
    p = subprocess.run([sys.executable, "-m", "debug_framework.cli.session_report", "--session-id", b.session_id,
                        "--output-format", "junit"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert ET.fromstring(p.stdout).find("testsuite").get("failures") == "0"
    p = subprocess.run([sys.executable, "-m", "debug_framework.cli.session_report", "--session-id", "nope"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "DF003" in p.stderr


def test_internal_error_exits_3_with_the_traceback_in_the_log(db, build, tmp_path, monkeypatch, capsys):
    from debug_framework.storage.sessions import SessionStore

    build(db, bug_layer=None, record=False)
    log_dir = tmp_path / "crash"
    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(log_dir))

    def broken_list_sessions(self, *args, **kwargs):
        raise RuntimeError("list broke")

    monkeypatch.setattr(SessionStore, "list", broken_list_sessions)
    assert main(["--list", "--database", str(db.database_path)]) == 3
    cap = capsys.readouterr()
    (log,) = log_dir.glob("session_report-*.log")
    (line,) = cap.err.splitlines()
    assert "internal error" in line and "RuntimeError: list broke" in line and str(log) in line
    assert "Traceback" not in cap.err and "broken_list_sessions" in log.read_text()
    assert main(["--list", "--json", "--database", str(db.database_path)]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 3 and doc["error"]["kind"] == "internal" and doc["error"]["log_file"]


def test_user_text_prints_literally(db, build, capsys):
    evil = "/models/[red]x[/red] :smile:"
    b = build(db, bug_layer=1, model_path=evil)
    assert main(["--list", "--database", str(db.database_path)]) == 0
    out = capsys.readouterr().out
    assert evil in out and b.session_id in out


def test_usage_errors_exit_2(db, capsys):
    dbp = str(db.database_path)
    for argv in (["--list", "--limit", "0", "--database", dbp], ["--diff", "a", "--database", dbp],
                 ["--session-id", "s", "--list", "--database", dbp], ["--bogus"]):
        assert main(argv) == 2, argv
        assert "Traceback" not in capsys.readouterr().err
