"""The drill-down's repro of one ONNX node that introduces error under ONNX Runtime, in the one repro
format (:mod:`debug_framework.repro_format`).

The directory holds ``node.onnx`` (the node alone), its inputs and the trusted float64 output as
``.npy`` files (read with ``allow_pickle=False``), ``repro.json`` (the bound, how ONNX Runtime was
configured, the graph transform: a file, or a module that is not installed, copied beside it as
``graph_transform.py``) and ``repro.py``, which needs only numpy, onnx and onnxruntime: it runs the
node as the backend did (same providers, optimisation level and graph transform) and says
``REPRO: reproduced`` (exit 1) while its error against the float64 output exceeds the bound.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...repro_format import is_installed, write_repro_files

if TYPE_CHECKING:
    import onnx

__all__ = ["write_onnx_repro"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

_BODY = '''
def check():
    spec = manifest()["check"]
    model = onnx.load(os.path.join(HERE, "node.onnx"))
    if spec.get("graph_transform"):
        module, _, attr = spec["graph_transform"].rpartition(":")
        sys.path.insert(0, HERE)
        model = getattr(importlib.import_module(module), attr)(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, spec["optimization"])
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=spec["providers"])
    feeds = {name: np.load(os.path.join(HERE, file), allow_pickle=False) for name, file in spec["inputs"].items()}
    got = session.run([spec["output"]], feeds)[0].astype(np.float64)
    want = np.load(os.path.join(HERE, "expected.npy"), allow_pickle=False)
    finite = np.isfinite(got) & np.isfinite(want) if got.shape == want.shape else None
    if finite is None or (~finite & ~((np.isnan(got) & np.isnan(want)) | (got == want))).any():
        error = float("inf")
    else:
        error = float(np.sqrt(np.mean((got[finite] - want[finite]) ** 2))) if finite.any() else 0.0
    bad = not error <= spec["bound"]
    detail = "ONNX node %s (%s): RMS error vs float64 %.3e %s bound %.3e" % (
        spec["node"], spec["op"], error, ">" if bad else "<=", spec["bound"])
    return bad, detail, {"node": spec["node"], "op": spec["op"], "rmse": error, "bound": spec["bound"]}
'''


def _graph_transform(spec: str | None, out: Path) -> str | None:
    """The repro's reference to the backend's graph transform: a ``.py`` file, or a module that is not
    installed, is copied beside the repro as ``graph_transform.py``; an installed module is named."""
    if not spec:
        return None
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        shutil.copyfile(target, out / "graph_transform.py")
        return f"graph_transform:{attr}"
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        found = None
    origin = getattr(found, "origin", None)
    if origin and origin.endswith(".py") and not is_installed(origin) and Path(origin).name != "__init__.py":
        shutil.copyfile(origin, out / "graph_transform.py")
        return f"graph_transform:{attr}"
    return spec  # installed (or not found: the repro then says it cannot run)


def write_onnx_repro(out: Path, *, node: str, op: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], output: str,
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
    check = {"node": node, "op": op, "output": output, "inputs": files, "bound": float(bound),
             "optimization": optimization, "providers": list(providers),
             "graph_transform": _graph_transform(graph_transform, directory)}
    write_repro_files(directory, writer="drilldown-onnx", body=_BODY, check=check,
                      requires=["numpy", "onnx", "onnxruntime"],
                      imports=["import importlib", "import numpy as np", "import onnx",
                               "import onnxruntime as ort"],
                      failure=f"ONNX node {node[:200]} ({op}) under ONNX Runtime exceeds its bound against float64")
    return directory
