"""Standalone repro written by debug_framework's op sweep.

plugin example-triton (triton), kernel softmax implementing aten::softmax.int
sample: softmax.with_dtype[1]
Run: python repro.py   (exit 1: the kernel fails the rule, 0: it passes)
"""
import importlib.util
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
ARTIFACT = '/tmp/pytest-of-root/pytest-243/test_validate_the_triton_examp0/cache/b0/b05d138398b84e719cfb9e65748f8000ced78d16193d12ac9750254b3bc041ef/example-triton.py'
BACKEND = 'triton'
ENTRY = 'softmax'
REFERENCE_FILE = None
REFERENCE = 'aten::softmax.int'
META = json.loads((HERE / "sample.json").read_text())
STORAGES = load_file(str(HERE / "inputs.safetensors"))


def value(v):
    if isinstance(v, dict) and "storage" in v:
        return STORAGES[v["storage"]].as_strided(v["shape"], v["stride"], v["offset"])
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


if BACKEND == "triton":
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
kwargs = {k: value(v) for k, v in META["kwargs"].items()}
oracle = reference(*up(args), **up(kwargs))
baseline = reference(*args, **kwargs)
out = kernel(*args, **kwargs)


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
bound = 2.0 * b + 1e-5
print(f"RMSE vs float64 reference: kernel {k:.3e}, reference in {out.dtype} {b:.3e}, bound {bound:.3e}")
bad = nonfinite_mismatches(out) > nonfinite_mismatches(baseline) or not k <= bound
print("FAIL" if bad else "PASS")
sys.exit(1 if bad else 0)
