"""Mock-accelerator settings and the one place that reads the ``MOCK_*`` environment variables.

| variable          | meaning                                              | default      |
|-------------------|------------------------------------------------------|--------------|
| ``MOCK_STRICT``   | 1: raise on violations; 0: log and record them       | ``1``        |
| ``MOCK_ALIGNMENT``| every tensor dim must be a multiple of this          | ``1``        |
| ``MOCK_MAX_MEMORY``| max bytes of one tensor                             | ``17179869184`` (16 GiB) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from debug_framework.errors import BackendInitializationError

from .constraints import (
    Constraint,
    DtypeConstraint,
    LayoutConstraint,
    MemoryConstraint,
    OpDenylistConstraint,
    ShapeConstraint,
)

__all__ = ["MockConfig", "DEFAULT_MOCK_DENYLIST", "read_mock_env"]

#: Ops the mock accelerator does not implement (LU decompositions have no accelerator kernel).
DEFAULT_MOCK_DENYLIST: tuple[str, ...] = (
    "aten.linalg_lu.default",
    "aten.linalg_lu_factor_ex.default",
    "aten.lu_unpack.default",
    "aten._linalg_svd.default",
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class MockConfig:
    strict: bool = True
    alignment: int = 1
    max_memory: int = 17179869184

    def constraints(self) -> list[Constraint]:
        """The mock accelerator's default constraint set."""
        return [
            OpDenylistConstraint(DEFAULT_MOCK_DENYLIST),
            ShapeConstraint(alignment=self.alignment),
            DtypeConstraint(),
            LayoutConstraint(require_contiguous=True, allow_channels_last=False, check_views=False),
            MemoryConstraint(max_tensor_bytes=self.max_memory),
        ]


def read_mock_env(environ: Mapping[str, str] | None = None) -> MockConfig:
    """Build a :class:`MockConfig` from ``MOCK_STRICT``, ``MOCK_ALIGNMENT``, ``MOCK_MAX_MEMORY``."""
    env = os.environ if environ is None else environ
    strict_raw = env.get("MOCK_STRICT", "1").strip().lower()
    if strict_raw not in _TRUE | _FALSE:
        raise BackendInitializationError(f"MOCK_STRICT={strict_raw!r} is not 0/1", backend="mock_accel",
                                         hint="set MOCK_STRICT=1 (raise) or MOCK_STRICT=0 (warn)")

    def _int(name: str, default: int, minimum: int) -> int:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise BackendInitializationError(f"{name}={raw!r} is not an integer >= {minimum}", backend="mock_accel",
                                             hint=f"set {name} to an integer >= {minimum}")
        return value

    return MockConfig(
        strict=strict_raw in _TRUE,
        alignment=_int("MOCK_ALIGNMENT", 1, 1),
        max_memory=_int("MOCK_MAX_MEMORY", 17179869184, 1),
    )
