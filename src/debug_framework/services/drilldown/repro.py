"""The standalone repro of a drill-down's culprit: one operator, its inputs, the trusted value.

The folder holds ``inputs.safetensors`` (the operator's tensor inputs exactly as replayed, and the
trusted float64 output), ``call.json`` (the operator, its non-tensor arguments, the bound) and
``repro.py``: it runs the operator (for a plugin backend: with the plugin's kernels swapped in),
prints the RMS error against the trusted value and the bound, and exits 1 while the error is
beyond the bound, 0 once it is fixed. No pickle anywhere. It is run once after writing: a repro
that reproduces is ``verified``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from .judge import Replay
from .paths import docstring_safe

__all__ = ["write_and_verify", "REPRO_TIMEOUT_S"]

#: How long the one verifying run of a repro may take.
REPRO_TIMEOUT_S = 300

_TEMPLATE = '''"""Standalone repro written by debug_framework's drill-down.

{what}
Run: python repro.py   (exit 1: the operator is beyond its bound, the bug is there; 0: fixed)
"""
import contextlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
CALL = json.loads((HERE / "call.json").read_text())
TENSORS = load_file(str(HERE / "inputs.safetensors"))


def value(v):
    if isinstance(v, dict) and "tensor" in v:
        return TENSORS[v["tensor"]].to(CALL["device"])
    if isinstance(v, dict) and "dtype" in v:
        return getattr(torch, v["dtype"])
    if isinstance(v, dict) and "memory_format" in v:
        return getattr(torch, v["memory_format"])
    if isinstance(v, dict) and "device" in v:
        return torch.device(v["device"])
    if isinstance(v, dict) and "layout" in v:
        return getattr(torch, v["layout"])
    if isinstance(v, list):
        return [value(x) for x in v]
    return v


def kernels():
    """The plugin's kernels in place of the ATen operators they implement (a plugin backend)."""
    plugin = CALL.get("plugin")
    if plugin is None:
        return contextlib.nullcontext()
    sys.path.insert(0, plugin["framework_path"])
    from debug_framework.plugins.loading import load_plugin
    from debug_framework.plugins.manifest import PluginDefinition
    from debug_framework.plugins.swap import AtenSwap

    definition = PluginDefinition.from_dict(plugin["definition"])
    return AtenSwap(list(load_plugin(definition, plugin["artifact"]).values()))


ns, name, overload = CALL["op"].split(".")
op = getattr(getattr(getattr(torch.ops, ns), name), overload)
args = [value(a) for a in CALL["args"]]
kwargs = {{k: value(v) for k, v in CALL["kwargs"].items()}}
with torch.no_grad(), kernels():
    out = op(*args, **kwargs)
out = out[0] if isinstance(out, (tuple, list)) else out
trusted = TENSORS["trusted"].double()
if out.shape != trusted.shape:
    print(f"FAIL: output shape {{tuple(out.shape)}}, trusted {{tuple(trusted.shape)}}")
    sys.exit(1)
o = out.detach().to("cpu", torch.float64)
if bool((torch.isfinite(trusted) & ~torch.isfinite(o)).any()):
    print("FAIL: non-finite output where the trusted value is finite")
    sys.exit(1)
ok = torch.isfinite(o) & torch.isfinite(trusted)
err = float(((o - trusted)[ok] ** 2).mean().sqrt()) if ok.any() else 0.0
bound = CALL["bound"]
print(f"{{CALL['op']}}: RMS error vs the trusted float64 value {{err:.3e}}, bound {{bound:.3e}}")
print("FAIL" if err > bound else "PASS")
sys.exit(1 if err > bound else 0)
'''


def _encode(v: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """An argument as JSON; tensors stored (contiguous, on the CPU) in ``tensors``."""
    if isinstance(v, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = v.detach().to("cpu").contiguous()
        return {"tensor": key}
    if isinstance(v, (list, tuple)):
        return [_encode(x, tensors) for x in v]
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    return v


def _plugin(backend: Any) -> dict[str, Any] | None:
    from ...plugins.swap import PluginBackend

    if not isinstance(backend, PluginBackend):
        return None
    return {"definition": backend.definition.to_dict(), "artifact": str(Path(backend.artifact).resolve()),
            "framework_path": str(Path(__file__).resolve().parents[3])}  # the folder holding debug_framework


def write_and_verify(folder: Path, replay: Replay, backend: Any, *, what: str) -> tuple[Path, bool]:
    """Write the repro of ``replay`` into ``folder`` and run it once: ``(folder, reproduced)``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    call = {"op": str(replay.target), "args": _encode(list(replay.args), tensors),
            "kwargs": {k: _encode(v, tensors) for k, v in replay.kwargs.items()},
            "bound": replay.bound, "introduced": replay.introduced, "device": str(getattr(backend, "device", "cpu")),
            "plugin": _plugin(backend)}
    tensors["trusted"] = replay.trusted.detach().to("cpu", torch.float64).contiguous()
    save_file(tensors, str(folder / "inputs.safetensors"))
    (folder / "call.json").write_text(json.dumps(call, indent=1), encoding="utf-8")
    (folder / "repro.py").write_text(_TEMPLATE.format(what=docstring_safe(what)), encoding="utf-8")
    return folder, _reproduces(folder)


def _reproduces(folder: Path) -> bool:
    """Run ``repro.py`` once: True when it exits 1 (the failure is there)."""
    try:
        done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True,
                              timeout=REPRO_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    (folder / "repro.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    lines = done.stdout.strip().splitlines()
    return done.returncode == 1 and bool(lines) and lines[-1].startswith("FAIL")  # not a crash (also exit 1)
