"""Checking a built artifact: it loads, the operators (or Metal functions) its plugin declares are
there with the right schemas, and ``torch.library.opcheck`` passes on each registered operator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import PluginCompilationError
from ..jsonio import JsonObject
from .manifest import KernelSpec, PluginDefinition

if TYPE_CHECKING:
    from .samples import Sample

__all__ = ["validate_artifact", "METALLIB_MAGIC", "opcheck_samples"]

#: The first bytes of a ``.metallib`` file.
METALLIB_MAGIC = b"MTLB"


def opcheck_samples(spec: KernelSpec, limit: int = 2) -> list[Sample]:
    """A few small samples of a kernel to run ``opcheck`` on (fuzzed, else OpInfo)."""
    from .samples import make_samples

    samples = [s for s in make_samples(spec, opinfo=False)
               if s.source == "shape" and all(a.numel() > 0 for a in s.args if isinstance(a, torch.Tensor))]
    small = sorted(samples, key=lambda s: sum(a.numel() for a in s.args if isinstance(a, torch.Tensor)))
    if not small:
        small = [s for s in make_samples(spec) if s.source == "opinfo"]
    return small[:limit]


def _opcheck(op: Callable[..., object], spec: KernelSpec) -> JsonObject:
    """``torch.library.opcheck`` on a few small samples: each test's first failure, or SUCCESS."""
    samples = opcheck_samples(spec)
    if not samples:
        return {"passed": True, "note": "no sample to run opcheck on (declare the kernel's inputs and args)"}
    from .samples import on_device

    results: dict[str, str] = {}
    for s in samples:
        args, kwargs = on_device(list(s.args), spec.devices[0]), on_device(dict(s.kwargs), spec.devices[0])
        try:
            out = torch.library.opcheck(op, tuple(args), kwargs, raise_exception=False)
        except Exception as exc:  # noqa: BLE001 - opcheck's own failure on the plugin's op is a result
            out = {"opcheck": f"{type(exc).__name__}: {exc}"}
        for test, verdict in out.items():
            if results.get(test, "SUCCESS") == "SUCCESS":
                results[test] = str(verdict).splitlines()[0][:300] if verdict != "SUCCESS" else "SUCCESS"
    return {"passed": all(v == "SUCCESS" for v in results.values()), "tests": results, "samples": len(samples)}


def _validate_metal(artifact: Path, defn: PluginDefinition | None) -> JsonObject:
    """A Metal library: its header, and each declared entry's symbol in it."""
    data = artifact.read_bytes()
    if not data.startswith(METALLIB_MAGIC):
        raise PluginCompilationError("the file is not a Metal library (no MTLB header)", artifact=str(artifact))
    kernels: dict[str, JsonObject] = {}
    for spec in defn.kernels if defn else ():
        found = spec.entry.encode() in data
        kernels[spec.name] = {"entry": spec.entry, "symbol_found": found, "passed": found}
    return {"passed": all(k["passed"] for k in kernels.values()), "kernels": kernels}


def validate_artifact(artifact: Path, backend_type: str, defn: PluginDefinition | None) -> JsonObject:
    """The checks of ``CompilationEngine.validation_report``, as a report.

    Without a plugin definition (an artifact built from a lone source), a C++/CUDA library passes
    when it loads and registers at least one operator.

    Raises:
        PluginCompilationError (DF008): a missing or unloadable artifact, a missing entry.
    """
    from .loading import load_library, load_plugin

    if not artifact.is_file():
        raise PluginCompilationError("the compiled artifact does not exist", artifact=str(artifact))
    if backend_type == "metal":
        return {"artifact": str(artifact), "backend_type": backend_type, **_validate_metal(artifact, defn)}
    if defn is None or not defn.kernels:
        if backend_type == "triton":
            return {"artifact": str(artifact), "backend_type": backend_type, "passed": True,
                    "note": "no kernels declared: the source was only syntax-checked"}
        before = set(torch._C._dispatch_get_all_op_names())
        load_library(artifact)
        new = sorted(set(torch._C._dispatch_get_all_op_names()) - before)
        return {"artifact": str(artifact), "backend_type": backend_type, "passed": bool(new), "registered_ops": new,
                "note": "" if new else "the library registered no new operator (or was loaded before)"}
    kernels = load_plugin(defn, artifact)
    report: dict[str, JsonObject] = {}
    for name, k in kernels.items():
        check = _opcheck(k.op, k.spec)
        report[name] = {"entry": str(k.op), "schema": str(k.op._schema), "notes": k.notes, "opcheck": check,
                        "passed": check["passed"]}
    return {"artifact": str(artifact), "backend_type": backend_type,
            "passed": all(r["passed"] for r in report.values()), "kernels": report}
