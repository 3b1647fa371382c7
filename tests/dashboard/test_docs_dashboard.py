"""docs/dashboard.md stays true: its commands' options are the launcher's, its Python example runs,
and the launcher binds to 127.0.0.1, headless, without usage statistics unless told otherwise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

DOC = ROOT / "docs" / "dashboard.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_commands_use_the_launchers_options():
    out = subprocess.run([sys.executable, "-m", "debug_framework.dashboard", "--help"], capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    used = set(re.findall(r"(--[a-z][a-z-]+)", _blocks("bash")[0])) - {"--help"}
    assert used == {"--database", "--artifacts", "--port", "--host"}
    assert all(flag in out.stdout for flag in used)


def test_the_launcher_binds_to_loopback_headless_without_usage_statistics():
    from debug_framework.dashboard.__main__ import main, streamlit_command

    cmd = streamlit_command("127.0.0.1", 8501)
    pairs = dict(zip(cmd[5::2], cmd[6::2]))
    assert cmd[2:4] == ["streamlit", "run"] and Path(cmd[4]).name == "app.py"
    assert pairs["--server.address"] == "127.0.0.1" and pairs["--server.headless"] == "true"
    assert pairs["--browser.gatherUsageStats"] == "false"
    assert main(["--port", "0"]) == 2


def test_the_settings_default_to_the_configured_database(monkeypatch, tmp_path):
    from debug_framework.dashboard.settings import DATABASE_VARIABLE, Settings

    monkeypatch.delenv(DATABASE_VARIABLE, raising=False)
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "x.db"))
    assert Settings.from_environment().database == tmp_path / "x.db"
    assert Settings.from_environment().artifacts == Path("debug_artifacts")
    monkeypatch.delenv("PIE_DEBUG_DATABASE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings.from_environment().database == tmp_path / ".pie" / "debug" / "debug_framework.db"
    monkeypatch.setenv(DATABASE_VARIABLE, "postgresql://u:secret@h/db")
    assert "secret" not in Settings.from_environment().location


def test_the_python_example_lists_the_tasks(monkeypatch, tmp_path, capsys):
    from debug_framework.dashboard.settings import DATABASE_VARIABLE
    from debug_framework.storage.database import Database
    from debug_framework.storage.tasks import TaskStore

    monkeypatch.setenv(DATABASE_VARIABLE, str(tmp_path / "tasks.db"))
    db = Database(tmp_path / "tasks.db")
    TaskStore(db).create("validation", {"model_path": "m"})
    db.close()
    exec(compile(_blocks("python")[0], str(DOC), "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["validation queued None None None None"]
