"""Fixtures for minifier tests: graphs with known bugs, and a clean-process runner for repros."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

HERE = Path(__file__).resolve().parent


def _load_buggy():
    spec = importlib.util.spec_from_file_location("buggy_backends", HERE / "buggy_backends.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["buggy_backends"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def bb():
    return _load_buggy()


def chain_fn(n_ops: int, special: dict[int, str]):
    """A chain of ``n_ops`` error-preserving elementwise ops; ``special`` puts sigmoid/erf/tanh at positions."""
    def f(x):
        for i in range(n_ops):
            kind = special.get(i)
            if kind == "sigmoid":
                x = torch.sigmoid(x)
            elif kind == "erf":
                x = torch.erf(x)
            elif kind == "tanh":
                x = torch.tanh(x)
            elif kind == "double":
                x = x.double()
            elif i % 3 == 0:
                x = x + 0.01
            elif i % 3 == 1:
                x = x * 0.999
            else:
                x = torch.neg(x)
        return x
    return f


@pytest.fixture(scope="session")
def chain_graph():
    def make(n_ops: int, special: dict[int, str], shape=(8, 16)):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        gm = make_fx(chain_fn(n_ops, special))(x)
        return gm, [x]
    return make


BLOCKER = ("import runpy, sys\n"
           "for m in ('debug_module', 'debug_framework'):\n    sys.modules[m] = None\n"
           "try:\n    import debug_module\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit(99)\n"
           "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.fixture
def run_clean(tmp_path):
    """Run a repro.py in a fresh interpreter: cwd elsewhere, no PYTHONPATH, this project unimportable."""
    def run(repro: Path) -> subprocess.CompletedProcess:
        cwd = tmp_path / "elsewhere"
        cwd.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        return subprocess.run([sys.executable, "-I", "-c", BLOCKER, str(repro)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
    return run


def log2_bound(n: int) -> float:
    return 2 * math.log2(n) + 8
