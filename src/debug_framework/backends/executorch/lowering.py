"""A torch module to an ExecuTorch program: ``torch.export``, then lowered to XNNPACK's delegate or
left to ExecuTorch's portable kernels, then written as a ``.pte`` file.

The exporter (``executorch.exir``) is imported here only, where a program is made: running a
program needs the runtime alone (:mod:`.program`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BackendInitializationError

if TYPE_CHECKING:
    import torch

__all__ = ["DELEGATES", "Lowered", "lower_to_file", "lower_methods_to_file", "check_delegate"]

#: ``delegate=`` values and what runs the program's operators.
DELEGATES: dict[str, str] = {
    "xnnpack": "XNNPACK's delegate (what ExecuTorch runs on CPUs): the operators it supports run as XNNPACK "
               "kernels, the rest as portable kernels",
    "portable": "ExecuTorch's portable kernels, no delegate (every operator visible to ETDump)",
}


@dataclass(frozen=True)
class Lowered:
    """A program written by :func:`lower_to_file`: its file, the seconds ``torch.export`` and the
    lowering took, and its ETRecord (written beside it where asked for, else None)."""

    path: Path
    export_s: float
    lower_s: float
    etrecord: Path | None = None


def check_delegate(delegate: str, backend: str) -> str:
    """``delegate`` checked against :data:`DELEGATES` (DF002 naming the choices)."""
    if delegate not in DELEGATES:
        raise BackendInitializationError(f"unknown delegate {delegate!r}", backend=backend,
                                         hint=f"use delegate={' or delegate='.join(DELEGATES)}")
    return delegate


def _partitioners(delegate: str) -> list[object]:
    if delegate == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]
    return []


def lower_to_file(module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, delegate: str, backend: str, *,
                  etrecord: bool = False) -> Lowered:
    """Export ``module`` called on ``args`` (static shapes: the program runs inputs of these
    shapes), lower it for ``delegate`` and write the program to ``path``; with ``etrecord``, also
    the ETRecord (``<path>.etrecord``, ``args`` as its representative inputs) that ExecuTorch's
    Inspector compares an ETDump with.

    Raises:
        BackendInitializationError: the export or the lowering failed (DF002, naming the delegate).
    """
    return _lower({"forward": (module, args)}, path, delegate, backend, etrecord=etrecord)


def lower_methods_to_file(methods: dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]], path: Path,
                          delegate: str, backend: str) -> Lowered:
    """One program of several methods (``{name: (module, args)}``, each exported at its ``args``'
    shapes) whose mutable buffers (a static KV cache) are one state shared by every method
    (``share_mutable_buffers``): what one method writes, the next reads. Run it with
    :class:`~.program.LoadedMethods`.

    Raises:
        BackendInitializationError: the export or the lowering failed (DF002, naming the delegate).
    """
    return _lower(methods, path, delegate, backend, shared_state=True)


def _lower(methods: dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]], path: Path, delegate: str,
           backend: str, *, etrecord: bool = False, shared_state: bool = False) -> Lowered:
    """Export each method, lower them together for ``delegate`` and write the program to ``path``."""
    import torch

    try:
        from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes import MemoryPlanningPass
    except ImportError as exc:
        raise BackendInitializationError(f"ExecuTorch's exporter cannot be imported: {exc}", backend=backend,
                                         hint="pip install 'multi-backend-debug-framework[executorch]'") from exc
    start = time.perf_counter()
    exported = {}
    try:
        with torch.no_grad():
            for name, (module, args) in methods.items():
                exported[name] = torch.export.export(module, args, strict=False)
    except Exception as exc:
        raise BackendInitializationError(f"torch.export of {path.name} failed: {type(exc).__name__}: {exc}",
                                         backend=backend) from exc
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True)) \
        if shared_state else None
    try:
        edge = to_edge_transform_and_lower(exported if len(exported) > 1 else exported["forward"],
                                           partitioner=_partitioners(delegate), generate_etrecord=etrecord)
        program = edge.to_executorch(config)
        path.write_bytes(program.buffer)
        record = None
        if etrecord:
            record = path.with_name(path.name + ".etrecord")
            got = program.get_etrecord()
            got.update_representative_inputs(methods["forward"][1])
            got.save(str(record))
    except OSError as exc:
        raise BackendInitializationError(f"cannot write the program {path}: {exc}", backend=backend) from exc
    except Exception as exc:
        raise BackendInitializationError(f"lowering {path.name} for {delegate} failed: {type(exc).__name__}: {exc}",
                                         backend=backend) from exc
    return Lowered(path, export_s, time.perf_counter() - start, record)
