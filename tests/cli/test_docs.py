"""The main examples of docs/kerneldiff.md and docs/inductor-debug-cli.md run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.slow
def test_kerneldiff_doc_example(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", (DOCS / "kerneldiff.md").read_text(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "kerneldiff.md", "exec"), {"__name__": "__doc_example__"})
    assert "KernelDiff tiny_mlp: PASS" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_doc_example(tmp_path):
    (block,) = re.findall(r"<!-- doctest-bash -->\s*```bash\n(.*?)```", (DOCS / "inductor-debug-cli.md").read_text(), re.S)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", COLUMNS="200")
    p = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "graph break" in p.stdout and "shape_alignment" in p.stdout and "removed 1 run(s)" in p.stdout
    assert (tmp_path / "art" / "report.html").exists() and (tmp_path / "art" / "report.json").exists()
