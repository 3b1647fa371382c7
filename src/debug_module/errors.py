"""Errors raised by ``debug_module``; all belong to the ``debug_framework`` tree.

    DebugFrameworkError
    ├── BackendInitializationError (DF002)
    │   └── UnsupportedTorchVersionError      DF002 (defined in debug_framework.errors, re-exported)
    └── ValidationError (DF005)
        ├── ConstraintViolationError          DM002
        └── MinifierError                     DM010

``ConstraintViolationError`` carries every violation found (``.violations``, a list of
:class:`debug_module.constraints.Violation`) so callers can inspect or serialise them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from debug_framework.errors import UnsupportedTorchVersionError, ValidationError
from debug_framework.jsonio import JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from .constraints.base import Violation

__all__ = ["UnsupportedTorchVersionError", "ConstraintViolationError", "MinifierError"]


class ConstraintViolationError(ValidationError):
    """Strict mode: the graph violates the accelerator's constraints. Lists every violation."""

    code = "DM002"
    title = "Accelerator constraints violated"
    default_hint = (
        "change the model at the listed source lines, relax the constraints, or run in warn mode "
        "(strict=False / MOCK_STRICT=0) to log and record the violations instead"
    )

    def __init__(self, violations: list[Violation], *, graph: str | None = None,
                 run_dir: str | None = None, repro_path: str | None = None) -> None:
        self.violations = list(violations)
        self.repro_path = repro_path
        lines = [f"{len(self.violations)} violation(s) in graph {graph or '?'}:"]
        lines += [f"  {i + 1}. {v.describe()}" for i, v in enumerate(self.violations)]
        super().__init__("\n".join(lines), graph=graph, run_dir=run_dir, repro=repro_path)

    def to_dict(self) -> JsonObject:
        data = super().to_dict()
        data["violations"] = [v.to_dict() for v in self.violations]
        return data


class MinifierError(ValidationError):
    """The minifier cannot start or cannot produce a verified repro (signature does not hold on the input
    graph, unusable backend reference, unreadable saved graph ...)."""

    code = "DM010"
    title = "Minifier failed"
    default_hint = "check the failure signature against the original graph (see docs/minifier.md)"
