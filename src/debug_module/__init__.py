"""torch.compile debugging for custom accelerators: constraints, AOT capture, guards, KernelDiff, minifier.

Public names are imported lazily so ``import debug_module`` stays cheap::

    from debug_module import mock_backend, aot_mock_backend, GuardInspector
    from debug_module import AcceleratorAdapter, AcceleratorCapabilities
    from debug_module.constraints import ShapeConstraint, DtypeConstraint
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .errors import ConstraintViolationError

__all__ = [
    "mock_backend",
    "make_mock_backend",
    "aot_mock_backend",
    "GuardInspector",
    "GuardReport",
    "AcceleratorAdapter",
    "AcceleratorCapabilities",
    "MockAcceleratorAdapter",
    "MockConfig",
    "ConstraintViolationError",
    "UnsupportedTorchVersionError",
    "RunDirectory",
    "set_repro_writer",
    "constraint_error",
    "KernelDiffHarness",
    "DiffReport",
    "compare_tensors",
]

_LAZY = {
    "mock_backend": "debug_module.backend.mock",
    "make_mock_backend": "debug_module.backend.mock",
    "aot_mock_backend": "debug_module.aot_backend.mock",
    "GuardInspector": "debug_module.guards.inspector",
    "GuardReport": "debug_module.guards.inspector",
    "AcceleratorAdapter": "debug_module.adapters.base",
    "AcceleratorCapabilities": "debug_module.adapters.base",
    "MockAcceleratorAdapter": "debug_module.adapters.mock_adapter",
    "MockConfig": "debug_module.config",
    "ConstraintViolationError": "debug_module.errors",
    "UnsupportedTorchVersionError": "debug_module.errors",
    "RunDirectory": "debug_module.artifacts",
    "set_repro_writer": "debug_module.repro",
    "KernelDiffHarness": "debug_module.diff",
    "DiffReport": "debug_module.diff",
    "compare_tensors": "debug_module.diff",
}


def constraint_error(exc: BaseException) -> ConstraintViolationError | None:
    """The :class:`ConstraintViolationError` behind an exception from a compiled call, or ``None``.

    Dynamo wraps backend errors in ``BackendCompilerFailed``; this walks the cause chain."""
    from .errors import ConstraintViolationError

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, ConstraintViolationError):
            return e
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None)
        e = inner if isinstance(inner, BaseException) else (e.__cause__ or e.__context__)
    return None


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'debug_module' has no attribute {name!r}")
