"""The one place the op sweep finds an engine's op-sweep runtime by name (``debug_opsweep --runtime NAME``).

Each engine that runs exported single-operator ONNX graphs defines its runtime object in its own
package, ``debug_framework.backends.<engine>.opsweep.RUNTIME``
(:class:`~debug_framework.conformance.runtimes.OpSweepRuntime`); nothing else in the sweep names an
engine. Until the engine registry lists them, the known engines are the table below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .runtimes import OpSweepRuntime

__all__ = ["runtime_names", "find_runtime"]

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
