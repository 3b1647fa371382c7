"""Upgrading older conformance repros to the current, torch-only script (fast: no OpInfo, no compile)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from debug_framework.conformance.repro import upgrade_repros
from debug_framework.errors import ConfigurationError

OLD_SCRIPT = "try:\n    import torch\n    from safetensors.torch import load_file\nexcept ImportError:\n    pass\n"


def _old(folder: Path, writer: str, check: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "repro.py").write_text(OLD_SCRIPT)
    (folder / "repro.json").write_text(json.dumps({"format": "debug_framework.repro/1", "writer": writer,
                                                   "failure": "operator x compiled with inductor differs",
                                                   "requires": ["torch", "safetensors"], "check": check}))
    (folder / "inputs.safetensors").write_bytes(b"data")
    return folder


def test_upgrade_rewrites_conformance_scripts_only_and_keeps_their_data(tmp_path):
    sweep = _old(tmp_path / "inductor" / "x-float32-opinfo-0", "op-conformance", {"op": "x", "grad": False})
    runtime = _old(tmp_path / "ort" / "y", "op-conformance", {"op": "y", "runtime": "onnxruntime"})
    other = _old(tmp_path / "minified", "minifier", {})
    done = upgrade_repros(tmp_path)
    assert done == sorted([sweep / "repro.py", runtime / "repro.py"])
    for folder in (sweep, runtime):
        script = (folder / "repro.py").read_text()
        ast.parse(script)
        assert "def load_file(path)" in script and "import safetensors" not in script and "from safetensors" not in script
        assert "Failure: operator x compiled with inductor differs" in script
        assert (folder / "inputs.safetensors").read_bytes() == b"data"
    manifest = json.loads((sweep / "repro.json").read_text())
    assert manifest["requires"] == ["torch"] and manifest["check"] == {"op": "x", "grad": False}
    assert json.loads((runtime / "repro.json").read_text())["requires"] == ["torch", "onnxruntime", "onnx", "onnxscript"]
    assert "def runtime_call" in (runtime / "repro.py").read_text()
    assert (other / "repro.py").read_text() == OLD_SCRIPT  # another writer's script is not generic
    with pytest.raises(ConfigurationError):
        upgrade_repros(tmp_path / "missing")


def test_debug_opsweep_upgrade_repros_rewrites_and_reports(tmp_path, capsys):
    from debug_framework.cli.debug_opsweep import main

    folder = _old(tmp_path / "repros" / "x", "op-conformance", {"op": "x", "grad": False})
    assert main(["--upgrade-repros", str(tmp_path / "repros"), "--no-verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["upgraded"] == [{"repro": str(folder / "repro.py"), "reproduced": None}]
    assert "from safetensors" not in (folder / "repro.py").read_text()
    assert main(["--upgrade-repros", str(tmp_path / "none")]) == 2
    assert "not a directory of repros" in capsys.readouterr().err
