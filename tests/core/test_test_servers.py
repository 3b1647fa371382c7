"""The test suite's own process hygiene (issue 33, item 10): a server a test starts runs in a process
group of its own and is stopped whole, launcher's children included; a process started by the run
that is still alive at its end fails the run (``pytest_sessionfinish`` in tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

LAUNCHER = ("import subprocess, sys; "
            "subprocess.call([sys.executable, '-c', 'import time; time.sleep(120)  # grandchild-{tag}'])")


@pytest.fixture
def harness(request):
    """The root conftest module (its helpers are not importable by name under --import-mode=importlib)."""
    root = Path(__file__).resolve().parents[1] / "conftest.py"
    for plugin in request.config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and Path(plugin.__file__).resolve() == root:
            return plugin
    pytest.skip("the root conftest is not loaded")


def _wait_for(harness, tag: str) -> int:
    end = time.monotonic() + 20
    while time.monotonic() < end:
        for pid, cmd in harness._token_processes().items():
            if f"grandchild-{tag}" in cmd and "subprocess.call" not in cmd:
                return pid
        time.sleep(0.05)
    raise AssertionError("the launcher's child did not start")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_server_group_is_stopped_whole(harness):
    with harness.server_process([sys.executable, "-c", LAUNCHER.format(tag="a")], env=dict(os.environ)) as proc:
        child = _wait_for(harness, "a")
        assert proc.poll() is None
    assert not _alive(child) and proc.returncode is not None


def test_a_leftover_server_fails_the_run(harness, monkeypatch):
    monkeypatch.setattr(harness, "LEFTOVER_GRACE_S", 0.5)
    # what the dashboard test used to do: terminate the launcher only; its child is orphaned and survives
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(tag="b")], env=dict(os.environ),
                            start_new_session=True)
    try:
        child = _wait_for(harness, "b")
        proc.terminate()
        proc.wait(timeout=10)
        time.sleep(0.2)
        assert _alive(child) and child in harness._leftovers()
        # judge only this test's orphan: the run's own live helpers (a browser another test
        # module keeps open for the session, its driver) must not be killed by this test
        every = harness._leftovers
        monkeypatch.setattr(harness, "_leftovers", lambda: {p: c for p, c in every().items() if p == child})
        lines: list[str] = []
        session = types.SimpleNamespace(
            exitstatus=0, config=types.SimpleNamespace(pluginmanager=types.SimpleNamespace(
                get_plugin=lambda name: types.SimpleNamespace(write_line=lambda line, **kw: lines.append(line)))))
        harness.pytest_sessionfinish(session, 0)
        assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
        assert any(f"pid {child}" in line for line in lines), lines  # named
        end = time.monotonic() + 10
        while _alive(child) and time.monotonic() < end:  # then killed
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
