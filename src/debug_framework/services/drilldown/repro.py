"""The drill-down's repro of its culprit, in the one repro format (:mod:`debug_framework.repro_format`):
one operator, its inputs, the trusted value.

The directory holds ``inputs.safetensors`` (the operator's tensor inputs exactly as replayed, and the
trusted float64 output), ``repro.json`` (the operator, its non-tensor arguments, the bound; for a
plugin backend the kernel that replaces the operator, whose build is copied beside it) and
``repro.py``: it runs the operator (the plugin's kernel in its place where the backend dispatched
it), compares the RMS error against the trusted value with the bound, and says ``REPRO: reproduced``
(exit 1) while the error is beyond the bound, ``REPRO: fixed`` (exit 0) once it is not. It needs
torch alone (it reads the safetensors file itself); a torchao-quantized linear's repro also needs
torchao, and keeps the quantized weight as ``torchao_<n>.pt`` (read with ``weights_only=True``). It is verified once after writing (:func:`~debug_framework.repro_format.verify`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...backends.capabilities import capabilities
from ...plugins.repro import KERNEL_LOADER, plugin_kernel_entry
from ...repro_format import INPUTS, SAFETENSORS_READER, verify, write_repro_files
from .judge import Replay

if TYPE_CHECKING:
    from ...backends.base import Backend

__all__ = ["write_and_verify"]

_BODY = KERNEL_LOADER + SAFETENSORS_READER + '''

def value(v, tensors, device):
    if isinstance(v, dict) and "tensor" in v:
        return tensors[v["tensor"]].to(device)
    if isinstance(v, dict) and "linear_packed" in v:  # a dynamically quantized Linear's packed weights
        p = v["linear_packed"]
        q = tensors[p["int8"]]
        if p["axis"] is None:
            w = torch._make_per_tensor_quantized_tensor(q, p["scale"], p["zero_point"])
        else:
            w = torch._make_per_channel_quantized_tensor(q, tensors[p["scales"]], tensors[p["zero_points"]], p["axis"])
        return torch.ops.quantized.linear_prepack(w, tensors[p["bias"]] if p["bias"] else None)
    if isinstance(v, dict) and "torchao_weight" in v:  # a torchao-quantized weight (tensor subclass)
        import torchao  # noqa: F401  (registers its tensor classes for weights_only loading)

        if str(v.get("module", "")).startswith("torchao."):  # its class's module (a prototype's registers there)
            importlib.import_module(v["module"])
        return torch.load(os.path.join(HERE, v["torchao_weight"]), weights_only=True).to(device)
    if isinstance(v, dict) and "dtype" in v:
        return getattr(torch, v["dtype"])
    if isinstance(v, dict) and "memory_format" in v:
        return getattr(torch, v["memory_format"])
    if isinstance(v, dict) and "device" in v:
        return torch.device(v["device"])
    if isinstance(v, dict) and "layout" in v:
        return getattr(torch, v["layout"])
    if isinstance(v, list):
        return [value(x, tensors, device) for x in v]
    return v


def operator(spec, args):
    """The ATen operator, or the plugin's kernel where the backend dispatched to it (its dtypes, devices)."""
    if spec["op"] == "torch.nn.functional.linear":  # a torchao weight's linear (its __torch_function__)
        return torch.nn.functional.linear
    ns, name, overload = spec["op"].split(".")
    op = getattr(getattr(getattr(torch.ops, ns), name), overload)
    plugin = spec.get("plugin")
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if plugin is None or first is None:
        return op
    applies = str(first.dtype).replace("torch.", "") in plugin["dtypes"] and first.device.type in plugin["devices"]
    return load_kernel(plugin) if applies else op


def check():
    spec = manifest()["check"]
    tensors = load_file(os.path.join(HERE, "inputs.safetensors"))
    args = [value(a, tensors, spec["device"]) for a in spec["args"]]
    kwargs = {k: value(v, tensors, spec["device"]) for k, v in spec["kwargs"].items()}
    op = operator(spec, args)
    with torch.no_grad():
        out = op(*args, **kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    trusted = tensors["trusted"].double()
    bound = spec["bound"]
    if out.shape != trusted.shape:
        return True, "%s: output shape %s, trusted %s" % (spec["op"], list(out.shape), list(trusted.shape)), {
            "op": spec["op"], "shape": list(out.shape), "trusted_shape": list(trusted.shape), "bound": bound}
    o = out.detach().to("cpu", torch.float64)
    if bool((torch.isfinite(trusted) & ~torch.isfinite(o)).any()):
        return True, "%s: non-finite output where the trusted value is finite" % spec["op"], {
            "op": spec["op"], "rmse": float("inf"), "bound": bound}
    ok = torch.isfinite(o) & torch.isfinite(trusted)
    err = float(((o - trusted)[ok] ** 2).mean().sqrt()) if ok.any() else 0.0
    relation = ">" if err > bound else "<="
    detail = "%s: RMS error vs the trusted float64 value %.3e %s bound %.3e" % (spec["op"], err, relation, bound)
    return err > bound, detail, {"op": spec["op"], "rmse": err, "bound": bound}
'''


#: the key prefix of a torchao weight in the tensors to write: saved by ``torch.save`` as ``<key>.pt``
#: (read back with ``weights_only=True``), not into the safetensors file
_TORCHAO = "torchao_"


def _encode(v: object, tensors: dict[str, torch.Tensor]) -> object:
    """An argument as JSON; tensors stored (contiguous, on the CPU) in ``tensors``."""
    if isinstance(v, torch.Tensor) and type(v).__module__.startswith("torchao."):
        key = f"{_TORCHAO}{len(tensors)}"
        tensors[key] = v.detach().to("cpu")
        return {"torchao_weight": f"{key}.pt", "module": type(v).__module__}
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
    if isinstance(v, torch.ScriptObject) and hasattr(v, "unpack"):  # quantized Linear's packed parameters
        return {"linear_packed": _packed_linear(v, tensors)}
    return v


def _packed_linear(packed: object, tensors: dict[str, torch.Tensor]) -> dict[str, object]:
    """A ``LinearPackedParamsBase`` as its int8 weight, quantization parameters and bias (stored in
    ``tensors``), which ``repro.py`` packs again with ``quantized::linear_prepack``."""
    weight, bias = packed.unpack()

    def keep(t: torch.Tensor) -> str:
        key = f"t{len(tensors)}"
        tensors[key] = t.detach().to("cpu").contiguous()
        return key

    entry: dict[str, object] = {"int8": keep(weight.int_repr()), "bias": None if bias is None else keep(bias),
                             "axis": None}
    if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        entry.update(scale=float(weight.q_scale()), zero_point=int(weight.q_zero_point()))
    else:
        entry.update(axis=int(weight.q_per_channel_axis()), scales=keep(weight.q_per_channel_scales()),
                     zero_points=keep(weight.q_per_channel_zero_points()))
    return entry


def _plugin(backend: Backend, target: object, folder: Path) -> dict[str, object] | None:
    """For a plugin backend whose kernel replaces ``target``: that kernel, its build copied into ``folder``."""
    from ...plugins.swap import PluginBackend

    if not isinstance(backend, PluginBackend):
        return None
    kernel = next((k for k in backend.kernels if k.aten is not None and str(k.aten) == str(target)), None)
    return None if kernel is None else plugin_kernel_entry(backend.definition, kernel.spec, backend.artifact, folder)


def write_and_verify(folder: Path, replay: Replay, backend: Backend, *, what: str) -> tuple[Path, bool]:
    """Write the repro of ``replay`` into ``folder`` and verify it once: ``(folder, verified)``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    op = "torch.nn.functional.linear" if replay.target is torch.nn.functional.linear else str(replay.target)
    check = {"op": op, "args": _encode(list(replay.args), tensors),
             "kwargs": {k: _encode(v, tensors) for k, v in replay.kwargs.items()},
             "bound": replay.bound, "introduced": replay.introduced, "device": capabilities(backend).device,
             "plugin": _plugin(backend, replay.target, folder)}
    tensors["trusted"] = replay.trusted.detach().to("cpu", torch.float64).contiguous()
    for key in [k for k in tensors if k.startswith(_TORCHAO)]:
        torch.save(tensors.pop(key), folder / f"{key}.pt")
    save_file(tensors, str(folder / INPUTS))
    torchao = any(p.name.startswith(_TORCHAO) for p in folder.iterdir())
    write_repro_files(folder, writer="drilldown-replay", body=_BODY, requires=["torch", *(["torchao"] if torchao else [])],
                      imports=["import importlib.util", "import torch"],
                      failure=f"{what}: the operator's error against the trusted float64 value exceeds its bound",
                      check=check)
    return folder, verify(folder).reproduced
