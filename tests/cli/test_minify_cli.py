"""``inductor-debug minify``: a run directory made the way a user gets one (a model with a float64 cast
through ``aot_mock_backend`` in warn mode), minified from the CLI (in a fresh process once, in this
process for --json and the bad paths); the repro fails the same constraint in another fresh process
where this project is not importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from .conftest import check_json, run_cli, run_in_process


class Float64Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = h + h.to(torch.float64).sum(-1, keepdim=True).to(torch.float32)  # float64 on the accelerator
        return self.fc2(h)


@pytest.fixture(scope="module")
def float64_run(tmp_path_factory):
    import debug_module as dm
    from debug_framework._torch import dynamo

    root = tmp_path_factory.mktemp("minify_root")
    dynamo.reset()
    torch.manual_seed(0)
    backend = dm.aot_mock_backend(strict=False, artifact_root=root)  # warn mode: violations logged, run kept
    with torch.no_grad():
        torch.compile(Float64Net(), backend=backend)(torch.randn(4, 8))
    dynamo.reset()
    run = Path(backend.run_dir)
    assert list((run / "aot_graphs").glob("*.py")) and list((run / "fx_graphs").glob("*.py"))
    return root, run


def _run_repro(repro: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # no PYTHONPATH to the project
    return subprocess.run([sys.executable, str(repro)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _assert_reproduces_dtype(repro: Path, cwd: Path) -> None:
    assert {p.name for p in repro.parent.iterdir()} >= {"repro.py", "inputs.safetensors", "repro.json"}
    p = _run_repro(repro, cwd)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout.strip().splitlines()[-1].startswith("REPRO: reproduced: constraint 'dtype' violated")
    obs = json.loads(next(line for line in p.stdout.splitlines()
                          if line.startswith("REPRO-OBSERVATION: "))[len("REPRO-OBSERVATION: "):])
    assert any(v["constraint"] == "dtype" and "float64" in v["message"] for v in obs["violations"])


@pytest.mark.slow
def test_minify_aot_graph_file_human(float64_run, tmp_path):
    root, run = float64_run
    graph = sorted((run / "aot_graphs").glob("*.py"))[0]
    out = tmp_path / "repro_human"
    code, stdout, stderr = run_cli("--root", str(root), "minify", str(graph), "--output", str(out), cwd=tmp_path)
    assert code == 0, (stdout, stderr)
    assert "verified in a fresh process" in stdout and f"repro: {out / 'repro.py'}" in stdout
    _assert_reproduces_dtype(out / "repro.py", tmp_path)


@pytest.mark.slow
def test_minify_run_directory_json(float64_run, tmp_path, monkeypatch, capsys):
    """A run directory as PATH: its first violating graph is minified into <run>/repros/<graph>/."""
    root, run = float64_run
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_in_process(capsys, "--root", str(root), "--json", "minify", str(run))
    assert code == 0, (stdout, stderr)
    doc = check_json(stdout)
    assert doc["command"] == "minify" and doc["ok"] and doc["exit_code"] == 0 and doc["error"] is None
    data = doc["data"]
    assert data["verified"] is True and data["nodes"] >= 1 and data["nodes"] < data["original_nodes"]
    assert data["signature"]["kind"] == "constraint" and data["signature"]["constraint"] == "dtype"
    repro = Path(data["repro_path"])
    graph = sorted((run / "aot_graphs").glob("*.py"))[0]
    assert repro == run / "repros" / graph.stem / "repro.py"
    _assert_reproduces_dtype(repro, tmp_path)


def test_minify_bad_paths_are_environment_errors(tmp_path, capsys):
    root = tmp_path
    code, stdout, _ = run_in_process(capsys, "--root", str(root), "--json", "minify", str(tmp_path / "missing.py"))
    doc = check_json(stdout)
    assert code == 2 and doc["exit_code"] == 2 and doc["error"]["type"] == "environment"
    code, stdout, _ = run_in_process(capsys, "--root", str(root), "--json", "minify", str(tmp_path))  # neither repro nor run dir
    doc = check_json(stdout)
    assert code == 2 and "repro directory" in doc["error"]["message"] and "aot_graphs" in doc["error"]["hint"]
