"""A standalone repro of one ONNX node that introduces error under ONNX Runtime.

The directory holds ``node.onnx`` (the node alone), its inputs and the trusted float64 output as
``.npy`` files (read with ``allow_pickle=False``), ``repro.json`` (the bound, how ONNX Runtime was
configured) and ``repro.py``, which needs only numpy and onnxruntime: it runs the node as the
backend did (same providers, optimisation level and graph transform), prints the error against
the float64 output and exits 1 while it exceeds the bound, 0 once it does not. Its last line is
JSON with ``"reproduced"``: a repro is ``verified`` only when that line says true and it exits 1
(a crash, e.g. a graph transform that does not import, also exits 1 and verifies nothing).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .paths import docstring_safe

__all__ = ["write_onnx_repro", "verify_onnx_repro"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

_SCRIPT = '''"""Repro: ONNX node {node} ({op}) under ONNX Runtime against float64. Exit 1: the error is still there."""
import importlib, json, os, sys
import numpy as np
import onnx, onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    spec = json.load(open(os.path.join(HERE, "repro.json")))
    model = onnx.load(os.path.join(HERE, "node.onnx"))
    if spec.get("graph_transform"):
        module, _, attr = spec["graph_transform"].rpartition(":")
        sys.path.insert(0, HERE)
        model = getattr(importlib.import_module(module), attr)(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, spec["optimization"])
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=spec["providers"])
    feeds = {{name: np.load(os.path.join(HERE, file), allow_pickle=False) for name, file in spec["inputs"].items()}}
    got = session.run([spec["output"]], feeds)[0].astype(np.float64)
    want = np.load(os.path.join(HERE, "expected.npy"), allow_pickle=False)
    finite = np.isfinite(got) & np.isfinite(want) if got.shape == want.shape else None
    if finite is None or (~finite & ~((np.isnan(got) & np.isnan(want)) | (got == want))).any():
        error = float("inf")
    else:
        error = float(np.sqrt(np.mean((got[finite] - want[finite]) ** 2))) if finite.any() else 0.0
    bad = not error <= spec["bound"]
    print(json.dumps({{"node": spec["node"], "op": spec["op"], "rmse": error, "bound": spec["bound"], "reproduced": bad}}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _graph_transform(spec: str | None, out: Path) -> str | None:
    """The repro's reference to the backend's graph transform (a ``.py`` file is copied beside it)."""
    if not spec:
        return None
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        shutil.copyfile(target, out / "graph_transform.py")
        return f"graph_transform:{attr}"
    return spec


def write_onnx_repro(out: Path, *, node: str, op: str, model: Any, feeds: dict[str, np.ndarray], output: str,
                     expected: np.ndarray, bound: float, optimization: str, providers: list[str],
                     graph_transform: str | None) -> Path:
    """Write the repro directory ``out / "repro_<node>"`` and return it."""
    directory = out / f"repro_{_SAFE.sub('_', node)[:80] or 'node'}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "node.onnx").write_bytes(model.SerializeToString())
    files = {}
    for index, (name, value) in enumerate(feeds.items()):
        files[name] = f"input_{index}.npy"
        np.save(directory / files[name], np.asarray(value), allow_pickle=False)
    np.save(directory / "expected.npy", np.asarray(expected, dtype=np.float64), allow_pickle=False)
    spec = {"node": node, "op": op, "output": output, "inputs": files, "bound": float(bound),
            "optimization": optimization, "providers": list(providers),
            "graph_transform": _graph_transform(graph_transform, directory)}
    (directory / "repro.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    (directory / "repro.py").write_text(_SCRIPT.format(node=docstring_safe(node)[:200], op=docstring_safe(op)),
                                        encoding="utf-8")
    return directory


def _reproduced(stdout: str) -> bool:
    """Whether the repro's last line is its verdict, saying ``"reproduced": true``."""
    lines = stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else None
    except ValueError:
        return False
    return isinstance(verdict, dict) and verdict.get("reproduced") is True


def verify_onnx_repro(directory: Path, timeout: float = 120.0) -> bool:
    """Run ``repro.py`` once in a fresh process: True when it reproduces (its last line says so and it
    exits 1; a crash exits 1 too, without that line)."""
    try:
        done = subprocess.run([sys.executable, str(directory / "repro.py")], capture_output=True, text=True,
                              timeout=timeout, cwd=str(directory))
    except (OSError, subprocess.TimeoutExpired):
        return False
    (directory / "verify.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    return done.returncode == 1 and _reproduced(done.stdout)
