"""The one place the op sweep finds an engine's op-sweep runtime by name (``debug_opsweep --runtime NAME``).

Each engine that runs exported single-operator ONNX graphs defines its runtime object in its own
package, ``debug_framework.backends.<engine>.opsweep.RUNTIME`` (:class:`OpSweepRuntime`, defined
here), and its engine record (``backends.registry.Engine.opsweep_runtime``) names it; nothing in
the sweep names an engine.
"""

from __future__ import annotations

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


def runtime_names() -> tuple[str, ...]:
    """The names ``--runtime`` takes (the registered engines with an op-sweep runtime), in the
    registry's order."""
    from ..backends.registry import engines

    return tuple(e.name for e in engines() if e.opsweep_runtime)


def find_runtime(name: str) -> OpSweepRuntime:
    """The op-sweep runtime of engine ``name``, as its engine record names it (its module imported;
    the runtime's own packages are imported only when it runs).

    Raises:
        ConfigurationError (DF005): no registered engine of that name has an op-sweep runtime.
    """
    from ..backends.registry import engines, load_attribute

    record = next((e for e in engines() if e.name == name and e.opsweep_runtime), None)
    if record is None or record.opsweep_runtime is None:
        raise ConfigurationError(f"unknown runtime {name!r}", option="--runtime",
                                 hint=f"use {' or '.join(runtime_names())}")
    runtime = load_attribute(record.opsweep_runtime, name)
    return runtime  # type: ignore[return-value]  # the record names an OpSweepRuntime
