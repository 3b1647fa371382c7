"""scripts/setup.sh installs torch 2.13.0 from pip's configured index by default, or from TORCH_INDEX_URL.

Run on a copy of the script whose ``.venv/bin/python`` is a stand-in that logs its arguments (and says
torch is missing), so the test sees exactly which pip commands the script would run, without a network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


def _run_setup(tmp_path: Path, **env: str) -> list[str]:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy(SETUP, project / "scripts" / "setup.sh")
    log = tmp_path / "python.log"
    fake = project / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    # exit 1 for `python -c ...` (the torch version check: not installed), 0 for everything else (pip)
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\ncase "$1" in -c) exit 1;; esac\nexit 0\n')
    tools = tmp_path / "bin"  # chromium and dot present: the script installs no system packages
    tools.mkdir()
    for name in ("chromium", "dot"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
    for f in (fake, tools / "chromium", tools / "dot"):
        f.chmod(0o755)
    p = subprocess.run(["bash", str(project / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                       env={**{k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"},
                            "PATH": f"{tools}:{os.environ['PATH']}", **env})
    assert p.returncode == 0, p.stderr
    return [line for line in log.read_text().splitlines() if "pip install" in line]


def test_default_installs_the_pinned_torch_from_the_configured_index(tmp_path):
    installs = _run_setup(tmp_path)
    (torch_line,) = [line for line in installs if "torch==" in line]
    assert torch_line.endswith("torch==2.13.0") and "--index-url" not in torch_line
    assert installs.index(torch_line) < next(i for i, line in enumerate(installs) if ".[all]" in line)


def test_torch_index_url_chooses_another_index(tmp_path):
    installs = _run_setup(tmp_path, TORCH_INDEX_URL="https://download.pytorch.org/whl/cu128")
    (torch_line,) = [line for line in installs if "torch==" in line]
    assert "--index-url https://download.pytorch.org/whl/cu128 torch==2.13.0" in torch_line
