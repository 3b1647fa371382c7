"""The one place the op sweep finds an engine's op-sweep runtime by name (``debug_opsweep --runtime NAME``).

Each engine that runs exported single-operator ONNX graphs defines its runtime object in its own
package, ``debug_framework.backends.<engine>.opsweep.RUNTIME`` (:class:`OpSweepRuntime`, defined
here); nothing else in the sweep names an engine. Until the engine registry lists them, the known engines are the table below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = ["OpSweepRuntime", "GraphRun", "runtime_names", "find_runtime"]

#: A loaded graph: contiguous CPU tensors in (the graph's inputs in order), its outputs out.
GraphRun = Callable[[list["torch.Tensor"]], list["torch.Tensor"]]


class OpSweepRuntime(Protocol):
    """What an engine tells the op sweep to run its exported single-op graphs
    (``debug_framework.backends.<engine>.opsweep.RUNTIME``)."""

    #: the engine's name (``--runtime NAME``, the repro's label)
    name: str
    #: the Python packages it needs (the runtime's and the exporter's): checked before a sweep,
    #: listed in a repro's ``requires``
    packages: tuple[str, ...]
    #: the precision the runtime is asked to compute in (recorded with the repro), None for none
    precision_hint: str | None
    #: source of ``run_graph(data, tensors, spec)`` in a repro.py (``os``, ``torch`` and ``HERE``
    #: defined): the serialized graph run as the sweep ran it, outputs as torch tensors
    repro_runner: str

    def version(self) -> str | None:
        """The runtime's installed version."""
        ...

    def target(self, device: str) -> str:
        """The runtime's device (a provider, a device name) for a torch device name; DF002 where absent."""
        ...

    def session(self, data: bytes, target: str, scratch: Path) -> GraphRun:
        """The runtime loading the serialized graph ``data`` on ``target`` (files under ``scratch``)."""
        ...


#: engine name -> the module defining its ``RUNTIME`` (to be read from the engine registry)
_KNOWN: dict[str, str] = {
    "onnxruntime": "debug_framework.backends.onnxruntime.opsweep",
    "openvino": "debug_framework.backends.openvino.opsweep",
}


def runtime_names() -> tuple[str, ...]:
    """The names ``--runtime`` takes, in the order help lists them."""
    return tuple(_KNOWN)


def find_runtime(name: str) -> OpSweepRuntime:
    """The op-sweep runtime of engine ``name`` (its module imported; the runtime's own packages are
    imported only when it runs).

    Raises:
        ConfigurationError (DF005): no engine of that name has an op-sweep runtime.
    """
    module = _KNOWN.get(name)
    if module is None:
        raise ConfigurationError(f"unknown runtime {name!r}", option="--runtime",
                                 hint=f"use {' or '.join(runtime_names())}")
    runtime: OpSweepRuntime = importlib.import_module(module).RUNTIME
    return runtime
