"""docs/gguf.md runs: its Python example prints what it says, and its commands exit as it says."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "gguf.md"

pytest.importorskip("xllamacpp")


def test_python_example(capsys: pytest.CaptureFixture[str]) -> None:
    block = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[0]
    exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["True", "q8_0", "1 attention Kcur-1"]


@pytest.mark.slow  # three CLI processes (about 8 s each on 2 cores)
def test_commands(hf_llama: Path, tmp_path: Path) -> None:
    from debug_framework.backends.llamacpp.convert import write_gguf

    shutil.copytree(hf_llama, tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "model-q8_0.gguf", tensor_type="q8_0")
    commands = re.findall(r"```bash\n(debug_validate .*?)\n```", DOC.read_text(encoding="utf-8"))
    env = {**os.environ, "PIE_DEBUG_DATABASE": str(tmp_path / "db.sqlite")}
    codes = []
    for line in commands:
        args = line.split()[1:]
        done = subprocess.run([sys.executable, "-m", "debug_framework.cli.debug_validate", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        codes.append(done.returncode)
        if "float32" in args:
            assert "q8_0" in done.stdout  # consistent with its quantization
    assert codes == [0, 0, 1]
