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
