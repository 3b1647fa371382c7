"""A read-only install used by a service account without a writable HOME can still import and run
the comparison core: numba's on-disk cache is used where it can be written and skipped where not.

The install is a copy of the package in which no ``__pycache__`` directory can be created (a regular
file holds each name; this refuses root too, unlike file modes), HOME is a regular file (so no
``~/.cache``), and neither ``NUMBA_CACHE_DIR`` nor ``XDG_CACHE_HOME`` is set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "debug_framework"


def _read_only_install(root: Path) -> Path:
    site = root / "site"
    shutil.copytree(PACKAGE, site / "debug_framework", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for init in (site / "debug_framework").rglob("__init__.py"):
        (init.parent / "__pycache__").write_text("not a directory: nothing can be cached here\n")
    return site


@pytest.mark.slow  # a child process importing the package (~2-4 s)
def test_the_comparison_core_imports_and_runs_without_a_writable_cache(tmp_path):
    site = _read_only_install(tmp_path)
    home = tmp_path / "home"
    home.write_text("HOME is a file: ~/.cache cannot exist\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "PYTHONPATH")}
    env.update(HOME=str(home), PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    code = ("import numpy as np\n"
            "from debug_framework.comparison import _kernel\n"
            "print(_kernel.__file__)\n"
            "print('cached', _kernel.CACHE_ENABLED)\n"
            "from debug_framework.comparison import compare  # the public core imports\n"
            "tv, ti = np.full(2, -1.0), np.full(2, -1, np.int64)  # and a kernel compiles and runs\n"
            "print('kernel', _kernel._topk_insert(tv, ti, 5.0, 7), ti.tolist())\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(str(site)), lines  # the read-only copy, not the source tree
    assert lines[1:] == ["cached False", "kernel -1.0 [7, -1]"], lines
    assert not [p for p in site.rglob("*") if p.is_dir() and p.name == "__pycache__"]
