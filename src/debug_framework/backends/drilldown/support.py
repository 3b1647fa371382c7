"""What the drill-down strategies for one named backend share: whether they apply, and the error when not."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ...backends.capabilities import capabilities, offers
from ...errors import ConfigurationError
from .types import DrillRequest

__all__ = ["BackendStrategy"]


class BackendStrategy:
    """Base of a strategy for one backend (``backend_name``) that needs a ``method`` of it (an
    engine-specific entry point: :func:`~debug_framework.backends.capabilities.offers`); ``label``
    names that backend in messages."""

    name: ClassVar[str] = ""
    backend_name: ClassVar[str] = ""
    method: ClassVar[str] = ""
    label: ClassVar[str] = ""

    def applies(self, backend: Any) -> tuple[bool, str]:
        """``(True, "")`` for the prepared backend this strategy drills (its name, and the method
        ``method`` it offers), else ``(False, why)``."""
        caps = capabilities(backend)
        if caps.name != self.backend_name or not offers(backend, self.method):
            return False, f"backend {caps.name!r} is not {self.label}"
        if not caps.prepared:
            return False, f"the {self.label} backend is not prepared"
        return True, ""

    def _start(self, request: DrillRequest) -> Path:
        """Check ``request.backend`` (ConfigurationError, DF005, when this strategy does not apply) and
        create ``request.out_dir``; returns it."""
        ok, why = self.applies(request.backend)
        if not ok:
            raise ConfigurationError(f"the {self.label} drill-down cannot drill this backend: {why}",
                                     hint=f"drill {self.label} sessions with it; other backends have their own strategy")
        out = Path(request.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        return out
