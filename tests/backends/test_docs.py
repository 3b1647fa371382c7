"""The example of docs/backends-more.md runs: availability, auto, MLX vs PyTorch on MiniLM, versions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends-more.md"


@pytest.mark.slow  # loads MiniLM twice (about 3 s)
def test_example_runs(capsys):
    block = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[0]
    exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("python_reference") and any(line.startswith("auto picked") for line in out)
    assert out[-2] == "True"
