"""``debug-dashboard`` stops its Streamlit server when it is stopped (issue 30, item 7): SIGTERM to
the launcher (not to its process group) frees the port, so the dashboard can be started again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_its_server(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path),
           "PIE_DEBUG_LOG_DIR": str(tmp_path / "logs")}
    log = open(tmp_path / "server.log", "wb")
    launcher = subprocess.Popen([sys.executable, "-m", "debug_framework.dashboard", "--database",
                                 str(tmp_path / "d.db"), "--port", str(port)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    health = f"http://127.0.0.1:{port}/_stcore/health"
    try:
        end = time.monotonic() + 60
        while not _answers(health):
            assert launcher.poll() is None and time.monotonic() < end, (tmp_path / "server.log").read_text()
            time.sleep(0.3)
        launcher.send_signal(signal.SIGTERM)  # the launcher alone, as a service manager or `kill PID` does
        assert launcher.wait(timeout=30) == 0
        assert not _answers(health), "the Streamlit server still answers after the launcher stopped"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        else:  # whatever the launcher left in its session (nothing, when it works)
            try:
                os.killpg(launcher.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
