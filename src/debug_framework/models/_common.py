"""Helpers shared by the record classes: timestamps, atomic file writes, and the seam through which
a record reaches a collaborator of an upper layer (a report renderer, a batch executor).

Records never import :mod:`debug_framework.services` or :mod:`debug_framework.reports`. A record
method that needs one of them (``ValidationReport.generate_html_report``,
``BatchValidationJob.execute``) takes the collaborator as a parameter or attribute; when neither is
given it asks the record module's :class:`Collaborator` slot, which the composition root
(``debug_framework/__init__.py``, run before any submodule) fills with a factory that imports the
upper layer only when first called.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from ..errors import FrameworkInitializationError
from ..storage.values import format_time, now_utc, parse_time

__all__ = ["now_utc", "parse_time", "format_time", "write_text_atomic", "Collaborator"]

T = TypeVar("T")


def write_text_atomic(path: os.PathLike[str] | str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``: a reader never sees a
    half-written file. Creates parent directories; ``OSError`` propagates to the caller."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


class Collaborator(Generic[T]):
    """The process-wide default of one collaborator a record needs from an upper layer.

    ``install(factory)`` (done by the composition root) registers a zero-argument factory; ``get()``
    builds the collaborator on first use and keeps it. Installing another factory (a test, an
    application with its own renderer) replaces it and returns the previous factory.
    """

    def __init__(self, role: str, how_to_pass: str) -> None:
        self.role = role
        self.how_to_pass = how_to_pass
        self._factory: Callable[[], T] | None = None
        self._instance: T | None = None
        self._lock = threading.Lock()

    def install(self, factory: Callable[[], T] | None) -> Callable[[], T] | None:
        """Use ``factory`` from now on (``None`` removes the default); returns the previous factory."""
        with self._lock:
            previous, self._factory, self._instance = self._factory, factory, None
        return previous

    def get(self) -> T:
        """The default collaborator. FrameworkInitializationError (DF001) when none is installed."""
        with self._lock:
            if self._instance is None:
                if self._factory is None:
                    raise FrameworkInitializationError(
                        f"no default {self.role} is installed",
                        hint=f"import debug_framework (its __init__ installs the defaults), or {self.how_to_pass}",
                    )
                self._instance = self._factory()
            return self._instance
