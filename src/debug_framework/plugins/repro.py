"""The op sweep's repro of one sample, in the one repro format (:mod:`debug_framework.repro_format`).

The directory holds the sample's tensors (exact storage, strides and offsets) in ``inputs.safetensors``,
a copy of the plugin's build (``plugin_<artifact>``) and of its reference file when it has one,
``repro.json`` (the sample's layout, the kernel, the rule) and ``repro.py``, which needs only torch (it
reads the safetensors file itself): it loads the build, runs the kernel and the reference (in float64 and in the kernel's
dtype), and says ``REPRO: reproduced`` (exit 1) while the kernel fails the sweep's rule.

:data:`KERNEL_LOADER` and :func:`plugin_kernel_entry` also serve the drill-down's operator repro of a
plugin backend, which runs the plugin's kernel in place of the operator it replaces.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
import torch

from ..comparison import FLOOR_EPS, NOISE_MARGIN
from ..jsonio import JsonObject, JsonValue
from ..repro_format import INPUTS, SAFETENSORS_READER, write_repro_files
from .evaluate import FLOAT64_FLOOR_EPS
from .manifest import KernelSpec, PluginDefinition
from .samples import Sample

__all__ = ["write_repro_dir", "KERNEL_LOADER", "SAMPLE_DECODER", "plugin_kernel_entry", "encode_value", "save_sample"]

#: Source of ``load_kernel(entry)`` for a generated repro.py (needs ``os``, ``torch`` and
#: ``importlib.util`` imported and ``HERE`` set): the kernel of :func:`plugin_kernel_entry`'s entry.
KERNEL_LOADER = '''
def load_source(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_kernel(plugin):
    """The plugin's kernel, from its build copied beside this script (a Triton source or a library)."""
    artifact = os.path.join(HERE, plugin["artifact"])
    if not os.path.isfile(artifact):
        raise CannotCheck("the plugin's build %s is missing" % plugin["artifact"])
    if plugin["backend_type"] == "triton":
        if plugin["device"] == "cpu":  # a kernel declared for the CPU runs in Triton's interpreter, GPU or not
            os.environ["TRITON_INTERPRET"] = "1"
        return getattr(load_source(artifact, "plugin_source"), plugin["entry"])
    torch.ops.load_library(artifact)
    ns, _, name = plugin["entry"].partition("::")
    name, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
'''

#: Source of ``value(v, storages, device)`` (a sample's argument from :func:`encode_value`'s form and
#: the stored tensors) and ``up(v)`` (in float64) for a generated repro.py (needs ``torch`` imported).
SAMPLE_DECODER = '''
def value(v, storages, device):
    if isinstance(v, dict) and "storage" in v:
        return storages[v["storage"]].to(device).as_strided(v["shape"], v["stride"], v["offset"])
    if isinstance(v, dict) and "torch_dtype" in v:
        return getattr(torch, v["torch_dtype"])
    if isinstance(v, list):
        return [value(x, storages, device) for x in v]
    return v


def up(v):
    if isinstance(v, torch.Tensor):
        return v.double() if v.is_floating_point() else v
    if isinstance(v, list):
        return [up(x) for x in v]
    if isinstance(v, torch.dtype) and v.is_floating_point:
        return torch.float64
    return v
'''

#: The sweep repro's check: the kernel against the reference, by the sweep's calibrated rule.
_BODY = KERNEL_LOADER + SAFETENSORS_READER + SAMPLE_DECODER + '''

def first(out):  # an op returning several tensors is judged by its first, as the sweep does
    return out[0] if isinstance(out, (tuple, list)) else out


def rmse(x, oracle):  # scaled by the largest difference: values near 1e308 neither overflow nor underflow
    x, o = x.double(), oracle.double()
    both = torch.isfinite(x) & torch.isfinite(o)
    if not both.any():
        return 0.0
    d = (x / 2 - o / 2)[both]
    peak = float(d.abs().max())
    return 2.0 * peak * float(((d / peak) ** 2).mean().sqrt()) if peak > 0 else 0.0


def edge_overflows(out, oracle, dtype, floor):  # the kernel rounds to the infinity the reference is within rounding of
    info = torch.finfo(dtype)
    o = oracle.double()
    near = o.abs() >= info.max * (1.0 - floor * info.eps)
    return torch.isinf(out) & torch.isfinite(o) & near & (torch.sign(out.double()) == torch.sign(o))


def nonfinite_mismatches(x, oracle):
    x, o = x.double(), oracle.double()
    return int(((~torch.isfinite(x) | ~torch.isfinite(o)) & ~((x == o) | (x.isnan() & o.isnan()))).sum())


def check():
    spec = manifest()["check"]
    plugin = spec["plugin"]
    storages = load_file(os.path.join(HERE, "inputs.safetensors"))
    kernel = load_kernel(plugin)
    if spec["reference_file"] is None:
        ns, _, name = spec["reference"].partition("::")
        name, _, overload = name.partition(".")
        reference = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    else:
        reference = getattr(load_source(os.path.join(HERE, spec["reference_file"]), "plugin_reference"),
                            spec["reference"])
    args = [value(a, storages, plugin["device"]) for a in spec["args"]]
    kwargs = {k: value(v, storages, plugin["device"]) for k, v in spec["kwargs"].items()}
    oracle = first(reference(*up(args), **up(kwargs)))
    baseline = first(reference(*args, **kwargs))
    out = first(kernel(*args, **kwargs))
    what = "kernel %s (%s) on sample %s" % (plugin["kernel"], spec["op"], spec["sample"]["label"])
    shapes = {"kernel": [list(out.shape), str(out.dtype)], "reference": [list(baseline.shape), str(baseline.dtype)]}
    if out.shape != baseline.shape or out.dtype != baseline.dtype:
        return True, "%s: output %s, the reference's %s" % (what, shapes["kernel"], shapes["reference"]), shapes
    # the sweep's calibrated rule: MARGIN x the reference's error in its dtype + FLOOR_EPS x eps(dtype) x RMS(oracle)
    dtype = getattr(torch, spec["sample"]["dtype"], None)
    eps = torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) and dtype.is_floating_point else 0.0
    if eps and out.dtype.is_floating_point:
        edge = edge_overflows(out, oracle, dtype, spec["float64_floor_eps"] if dtype == torch.float64
                              else spec["floor_eps"])
        oracle, baseline, out = (t.masked_fill(edge, 0) for t in (oracle, baseline, out))
    k, b = rmse(out, oracle), rmse(baseline, oracle)
    fin = oracle.double()[torch.isfinite(oracle.double())].abs()
    peak = float(fin.max()) if fin.numel() else 0.0
    rms = peak * float(((fin / peak) ** 2).mean().sqrt()) if peak > 0 else 0.0
    floor = spec["float64_floor_eps"] if dtype == torch.float64 else spec["floor_eps"]
    bound = spec["margin"] * b + floor * eps * rms
    nonfinite = nonfinite_mismatches(out, oracle) > nonfinite_mismatches(baseline, oracle)
    detail = "%s: RMSE vs float64 %.3e, the reference in %s %.3e, bound %.3e%s" % (
        what, k, str(out.dtype).replace("torch.", ""), b, bound,
        "; more non-finite mismatches than the reference" if nonfinite else "")
    return nonfinite or not k <= bound, detail, {"kernel_error": k, "reference_error": b, "bound": bound,
                                                 "nonfinite_mismatch": nonfinite, **shapes}
'''


def plugin_kernel_entry(defn: PluginDefinition, spec: KernelSpec, artifact: str | Path, folder: Path) -> JsonObject:
    """Copy the plugin's build into ``folder``; what ``load_kernel`` of :data:`KERNEL_LOADER` needs
    to load ``spec``'s kernel from there (and when it applies: its dtypes and devices)."""
    source = Path(artifact).resolve()
    local = f"plugin_{source.name}"
    shutil.copyfile(source, folder / local)
    return {"plugin": defn.id, "backend_type": defn.backend_type, "kernel": spec.name, "entry": spec.entry,
            "artifact": local, "device": spec.devices[0], "dtypes": list(spec.dtypes), "devices": list(spec.devices)}


def _encode(v: object, tensors: dict[str, torch.Tensor]) -> JsonValue:
    """A sample argument as JSON, tensors stored with their whole storage and their view."""
    if isinstance(v, torch.Tensor):
        key = f"t{len(tensors)}"
        # the whole storage, on the CPU (a GPU sample's too: the file holds host memory)
        storage = torch.empty(0, dtype=v.dtype, device=v.device).set_(v.untyped_storage())
        tensors[key] = storage.detach().cpu().clone()
        return {"storage": key, "shape": list(v.shape), "stride": list(v.stride()), "offset": v.storage_offset()}
    if isinstance(v, (list, tuple)):
        return [_encode(x, tensors) for x in v]
    if isinstance(v, torch.dtype):
        return {"torch_dtype": str(v).removeprefix("torch.")}
    return v


#: A sample argument as JSON with its tensors put in ``tensors`` (whole storage and view), for
#: ``inputs.safetensors``; shared with the backend conformance sweep's repro.
encode_value = _encode


def save_sample(sample: Sample, folder: Path, name: str) -> tuple[Path, list[JsonValue], JsonObject]:
    """Make a repro's directory under ``folder`` (``name`` made a safe file name of at most 120
    characters) and write ``sample``'s tensors into its ``inputs.safetensors``; the directory and
    the sample's arguments and keyword arguments as JSON (:data:`encode_value`)."""
    from safetensors.torch import save_file

    out = folder / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    args = [_encode(a, tensors) for a in sample.args]
    kwargs = {k: _encode(v, tensors) for k, v in sample.kwargs.items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / INPUTS))
    return out, args, kwargs


def write_repro_dir(defn: PluginDefinition, artifact: Path, spec: KernelSpec, sample: Sample, folder: Path) -> Path:
    """Write the repro of ``sample`` into a new directory under ``folder``; the path of its ``repro.py``."""
    out, args, kwargs = save_sample(sample, folder, f"{defn.id}-{spec.name}-{sample.source}-{sample.label}")
    reference_file = None
    if spec.reference:
        ref_file, _, ref_fn = spec.reference.partition(":")
        reference_file = f"plugin_reference_{Path(ref_file).name}"
        shutil.copyfile(defn.root / ref_file, out / reference_file)
    check = {"plugin": plugin_kernel_entry(defn, spec, artifact, out), "op": spec.op_name,
             "reference_file": reference_file, "reference": ref_fn if spec.reference else spec.op_name,
             "margin": NOISE_MARGIN, "floor_eps": FLOOR_EPS, "float64_floor_eps": FLOAT64_FLOOR_EPS,
             "args": args, "kwargs": kwargs, "sample": sample.describe()}
    failure = (f"kernel {spec.name} of plugin {defn.id} ({defn.backend_type}) implementing {spec.op_name} fails the "
               f"sweep's rule on sample {sample.source}/{sample.label}")
    return write_repro_files(out, writer="plugin-sweep", failure=failure, body=_BODY, requires=["torch"],
                       imports=["import importlib.util", "import torch"],
                       check=check)
