"""The main example of docs/models-and-backends.md runs and prints agreeing checkpoints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "models-and-backends.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.slow
def test_main_example_runs(capsys):
    exec(compile(_blocks()[0], str(DOC), "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 14 and all(line.endswith("passed=True") for line in lines)


def test_user_backend_example_registers(tiny_qwen2, random_inputs):
    from debug_framework.backends import get_backend, unregister_backend
    from debug_framework.modelio import load_model

    exec(compile(_blocks()[1], str(DOC), "exec"), {})
    try:
        backend = get_backend("my_module")
        backend.prepare(load_model(tiny_qwen2["hf"]), "float32")
        assert len(backend.run(random_inputs)) == 10
        engine = get_backend("my_engine")
        engine.prepare(load_model(tiny_qwen2["hf"]), "float32")
        assert len(engine.run(random_inputs)) == 0  # it computes nothing, so it reports nothing
    finally:
        unregister_backend("my_module")
        unregister_backend("my_engine")


@pytest.mark.slow  # a debug_validate process (~4 s of imports)
def test_backend_from_the_command_line_example_runs(tiny_qwen2, tmp_path):
    """The doctest-bash block: a --backend-file that registers a module_backend, validated by debug_validate."""
    import os
    import subprocess
    import sys

    (block,) = re.findall(r"<!-- doctest-bash -->\s*```bash\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "MODEL": str(tiny_qwen2["hf"]), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200"}
    p = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "my_module (float32) vs python_reference (float64)" in p.stdout and "PASSED" in p.stdout
