"""The reproduce command of a session run by ``debug_validate`` (issue 30, item 2): recorded with the
session, it keeps every option of the run (user backends, plugin, config file, drill-down) with
paths made absolute, and run from another directory it reproduces the failure (exit 1)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from debug_framework.cli.validate_support import reproduce_command_line

SRC = Path(__file__).resolve().parents[2] / "src"

#: A user backend: the float32 NumPy Llama, every output off by 1 % (a numerical failure).
WRONG_BACKEND = '''
import numpy as np
from debug_framework.architectures.llama import LlamaReference
from debug_framework.backends import register_backend, user_backend
from debug_framework.capture import CheckpointKey

class Runner:
    def __init__(self, model, dtype, device):
        self.net = LlamaReference(model.config, model.weights, np.float32)
    def run(self, inputs, keys):
        out = self.net.forward(inputs.input_ids, inputs.attention_mask, {tuple(k) for k in keys})
        return {CheckpointKey(*k): v * np.float32(1.01) for k, v in out.items()}

register_backend("repro_wrong_llama", user_backend("repro_wrong_llama", Runner, dtypes=("float32",)))
'''


def test_every_option_is_kept_with_absolute_paths(tmp_path):
    line = reproduce_command_line("debug_validate", [
        "--model-path", "m", "--backend-file", "b.py", "--plugin=p/plugin.json", "--config-file", "c.json",
        "--drill-down", "--output-file", "out.html", "--database", "postgresql://u@h/db", "--alternative-backend", "x"],
        cwd=tmp_path)
    here = tmp_path.resolve()
    assert shlex.split(line) == [
        "debug_validate", "--model-path", str(here / "m"), "--backend-file", str(here / "b.py"),
        "--plugin", str(here / "p" / "plugin.json"), "--config-file", str(here / "c.json"), "--drill-down",
        "--database", "postgresql://u@h/db", "--alternative-backend", "x"]
    module = reproduce_command_line("debug_validate", ["--backend-module", "pkg.mod", "--model-path", "m"], cwd=tmp_path)
    assert module.startswith(f"cd {shlex.quote(str(here))} && debug_validate --backend-module pkg.mod")


@pytest.mark.slow
def test_the_reproduce_command_of_a_user_backend_session_reproduces_from_elsewhere(tiny_llama, tmp_path,
                                                                                     monkeypatch, capsys):
    from debug_framework.backends import unregister_backend
    from debug_framework.cli.debug_validate import run
    from debug_framework.cli.session_report import main as session_report

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "wrong.py").write_text(WRONG_BACKEND, encoding="utf-8")
    (work / "cfg.json").write_text(json.dumps({"enabled_checkpoints": ["post_mlp"]}), encoding="utf-8")
    monkeypatch.chdir(work)
    try:
        code = run(["--model-path", str(tiny_llama), "--backend-file", "wrong.py", "--alternative-backend",
                    "repro_wrong_llama", "--config-file", "cfg.json", "--database", "s.db", "--layers", "0:2",
                    "--json"])
    finally:
        unregister_backend("repro_wrong_llama")
    sid = json.loads(capsys.readouterr().out)["session_id"]
    assert code == 1
    assert session_report(["--session-id", sid, "--database", str(work / "s.db")]) == 0
    doc = json.loads(capsys.readouterr().out)["reproduce_command"]
    assert doc["exact"] is True and "--backend-file" in doc["command"] and str(work / "wrong.py") in doc["command"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", doc["command"]], cwd=elsewhere, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stderr
    rerun = json.loads(p.stdout)
    assert rerun["verdict"] == "failed" and rerun["alternative_backend"] == "repro_wrong_llama"
    assert rerun["session_id"] != sid
