"""A standalone repro of one sample of the op sweep: the sample's tensors (exact storage, strides and
offsets) in ``inputs.safetensors``, its layout in ``sample.json``, and ``repro.py`` that needs only
torch and safetensors: it loads the plugin's build, runs the kernel and the reference (in float64
and in the kernel's dtype), prints the errors, and exits 1 when the kernel fails the rule.

(The minifier's repro writer lives in ``debug_module`` and reduces FX graphs; ``debug_framework``
may not import it, and a single operator call needs no reduction, so the sweep writes its own.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from ..comparison import FLOOR_EPS, NOISE_MARGIN
from .evaluate import FLOAT64_FLOOR_EPS
from .manifest import KernelSpec, PluginDefinition
from .samples import Sample

__all__ = ["write_repro"]

_TEMPLATE = '''"""Standalone repro written by debug_framework's op sweep.

plugin {plugin_id!s} ({backend!s}), kernel {kernel!s} implementing {op!s}
sample: {label!s}
Run: python repro.py   (exit 1: the kernel fails the rule, 0: it passes)
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
ARTIFACT = {artifact!r}
BACKEND = {backend!r}
ENTRY = {entry!r}
REFERENCE_FILE = {reference_file!r}
REFERENCE = {reference!r}
DEVICE = {device!r}
META = json.loads((HERE / "sample.json").read_text())
STORAGES = load_file(str(HERE / "inputs.safetensors"))


def value(v):
    if isinstance(v, dict) and "storage" in v:
        return STORAGES[v["storage"]].to(DEVICE).as_strided(v["shape"], v["stride"], v["offset"])
    if isinstance(v, dict) and "torch_dtype" in v:
        return getattr(torch, v["torch_dtype"])
    if isinstance(v, list):
        return [value(x) for x in v]
    return v


def up(v):
    if isinstance(v, torch.Tensor):
        return v.double() if v.is_floating_point() else v
    if isinstance(v, list):
        return [up(x) for x in v]
    if isinstance(v, torch.dtype) and v.is_floating_point:
        return torch.float64
    return v


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first(out):  # an op returning several tensors is judged by its first, as the sweep does
    return out[0] if isinstance(out, (tuple, list)) else out


if BACKEND == "triton":
    if DEVICE == "cpu":  # a kernel declared for the CPU runs in Triton's interpreter, GPU or not
        os.environ["TRITON_INTERPRET"] = "1"
    kernel = getattr(load(ARTIFACT, "plugin_source"), ENTRY)
else:
    torch.ops.load_library(ARTIFACT)
    ns, _, name = ENTRY.partition("::")
    kernel = getattr(getattr(torch.ops, ns), name).default
if REFERENCE_FILE is None:
    ns, _, name = REFERENCE.partition("::")
    name, _, overload = name.partition(".")
    reference = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
else:
    reference = getattr(load(REFERENCE_FILE, "plugin_reference"), REFERENCE)

args = [value(a) for a in META["args"]]
kwargs = {{k: value(v) for k, v in META["kwargs"].items()}}
oracle = first(reference(*up(args), **up(kwargs)))
baseline = first(reference(*args, **kwargs))
out = first(kernel(*args, **kwargs))


def rmse(x):
    x, o = x.double(), oracle.double()
    both = torch.isfinite(x) & torch.isfinite(o)
    return float(((x - o)[both] ** 2).mean().sqrt()) if both.any() else 0.0


def nonfinite_mismatches(x):
    x, o = x.double(), oracle.double()
    return int(((~torch.isfinite(x) | ~torch.isfinite(o)) & ~((x == o) | (x.isnan() & o.isnan()))).sum())


print("kernel output", tuple(out.shape), out.dtype, "reference", tuple(baseline.shape), baseline.dtype)
if out.shape != baseline.shape or out.dtype != baseline.dtype:
    print("FAIL: shape or dtype differs from the reference")
    sys.exit(1)
k, b = rmse(out), rmse(baseline)
# the sweep's calibrated rule: MARGIN x the reference's error in its dtype + FLOOR_EPS x eps(dtype) x RMS(oracle)
dtype = getattr(torch, META["sample"]["dtype"], None)
eps = torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) and dtype.is_floating_point else 0.0
fin = oracle.double()[torch.isfinite(oracle.double())].abs()
peak = float(fin.max()) if fin.numel() else 0.0
rms = peak * float(((fin / peak) ** 2).mean().sqrt()) if peak > 0 else 0.0
bound = {margin!r} * b + ({float64_floor_eps!r} if dtype == torch.float64 else {floor_eps!r}) * eps * rms
print(f"RMSE vs float64 reference: kernel {{k:.3e}}, reference in {{out.dtype}} {{b:.3e}}, bound {{bound:.3e}}")
bad = nonfinite_mismatches(out) > nonfinite_mismatches(baseline) or not k <= bound
print("FAIL" if bad else "PASS")
sys.exit(1 if bad else 0)
'''


def _encode(v: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A sample argument as JSON, tensors stored with their whole storage and their view."""
    if isinstance(v, torch.Tensor):
        key = f"t{len(tensors)}"
        storage = torch.empty(0, dtype=v.dtype).set_(v.untyped_storage())
        tensors[key] = storage.clone()
        return {"storage": key, "shape": list(v.shape), "stride": list(v.stride()), "offset": v.storage_offset()}
    if isinstance(v, (list, tuple)):
        return [_encode(x, tensors) for x in v]
    if isinstance(v, torch.dtype):
        return {"torch_dtype": str(v).removeprefix("torch.")}
    return v


def write_repro(defn: PluginDefinition, artifact: Path, spec: KernelSpec, sample: Sample, folder: Path) -> Path:
    """Write the repro of ``sample`` under ``folder``; the path of its ``repro.py``."""
    from safetensors.torch import save_file

    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{defn.id}-{spec.name}-{sample.source}-{sample.label}")[:120]
    out = folder / slug
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    meta = {"args": [_encode(a, tensors) for a in sample.args],
            "kwargs": {k: _encode(v, tensors) for k, v in sample.kwargs.items()}, "sample": sample.describe()}
    save_file(tensors, str(out / "inputs.safetensors"))
    (out / "sample.json").write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
    ref_file, _, ref_fn = (spec.reference or "").partition(":")
    entry = spec.entry
    script = _TEMPLATE.format(
        plugin_id=defn.id, backend=defn.backend_type, kernel=spec.name, op=spec.op_name, label=sample.label,
        artifact=str(artifact.resolve()), entry=entry,
        reference_file=str((defn.root / ref_file).resolve()) if spec.reference else None,
        reference=ref_fn if spec.reference else spec.op_name,
        margin=NOISE_MARGIN, floor_eps=FLOOR_EPS, float64_floor_eps=FLOAT64_FLOOR_EPS, device=spec.devices[0])
    (out / "repro.py").write_text(script, encoding="utf-8")
    return out / "repro.py"
