"""``--json`` means stdout holds only the JSON document (issue 33, item 8): lines that user code,
Ray's driver threads or child processes write to stdout (at the Python or the file-descriptor level)
go to stderr while the command runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from debug_framework.cli.framework import stdout_for_json_only

ROOT = Path(__file__).resolve().parents[2]

NOISY = '''
import os, subprocess, sys
print("(raylet) A worker died or was killed while executing a task")
os.write(1, b"(raylet) raw fd-level line\\n")
subprocess.run([sys.executable, "-c", "print('a child process line')"])
'''


@pytest.mark.slow  # a fresh CLI process imports torch (seconds)
def test_debug_batch_json_stdout_is_only_json(tmp_path):
    (tmp_path / "noisy_backend.py").write_text(NOISY)
    listing = tmp_path / "models.txt"
    (tmp_path / "no-model").mkdir()  # exists (the paths are checked first), holds no model: the item fails
    listing.write_text(str(tmp_path / "no-model") + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "debug_framework.cli.debug_batch", str(listing), "--json",
                           "--backend-module", "noisy_backend", "--database", str(tmp_path / "b.db")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)  # one JSON document, nothing else
    assert doc["items"][0]["status"] == "failed"
    assert "(raylet) A worker died" in proc.stderr and "raw fd-level line" in proc.stderr
    assert "a child process line" in proc.stderr


def test_the_guard_restores_stdout(capfd):
    with stdout_for_json_only():
        print("to stderr")
        os.write(1, b"fd to stderr\n")
    print("to stdout")
    out, err = capfd.readouterr()
    assert out == "to stdout\n" and "to stderr" in err and "fd to stderr" in err
