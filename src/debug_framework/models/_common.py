"""Helpers shared by the record classes: timestamps, atomic file writes, and the seam through which
a spec face on a record reaches a collaborator of an upper layer (a report renderer, a batch runner).

Records never import :mod:`debug_framework.services` or :mod:`debug_framework.reports`. The two spec
verbs that need one of them (``ValidationReport.generate_html_report``/``save_to_file`` and
``BatchValidationJob.execute``, in :mod:`debug_framework.compat`) take the collaborator as a
parameter; without one they ask a :class:`Collaborator` slot, which the composition root
(``debug_framework/__init__.py``, run before any submodule) fills by role with a factory that
imports the upper layer only when first called. The project's own code calls the upper layer
directly and never goes through a slot.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar, cast

from ..errors import FrameworkInitializationError, unwritable_output
from ..safefiles import check_output_path, is_stdout
from ..storage.values import format_time, now_utc, parse_time

__all__ = ["now_utc", "parse_time", "format_time", "write_text_atomic", "write_report_file", "Collaborator", "install_default",
           "REPORT_RENDERER_ROLE", "BATCH_EXECUTOR_ROLE"]

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


def write_report_file(path: os.PathLike[str] | str, text: str, *, hint: str = "choose a writable output path",
                      option: str = "the output file", **context: object) -> None:
    """Write a file the user asked for (a report) through :func:`write_text_atomic`, so a failed write
    leaves the old file. ``-`` writes to standard output. An existing path that is a symlink or not a
    regular file (a FIFO, a device, a directory) is refused before anything is written
    (:func:`~debug_framework.safefiles.check_output_path`, ConfigurationError naming ``option``); no
    room to write (full disk, quota, read-only file system) is ResourceExhaustedError (DF007), any
    other ``OSError`` ConfigurationError (DF005: the path is unusable; ``hint`` names the option to change)."""
    if is_stdout(path):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    target = check_output_path(path, option)
    try:
        write_text_atomic(target, text)
    except OSError as exc:
        raise unwritable_output(exc, "write the report", hint=hint, file=str(path), **context) from exc


#: The roles of the records' upper-layer collaborators (keys of the defaults the composition root installs).
REPORT_RENDERER_ROLE = "report renderer"
BATCH_EXECUTOR_ROLE = "batch executor"


class _Default:
    """The process-wide default of one role: a factory, and what it built (built once, on first use)."""

    def __init__(self) -> None:
        self.factory: Callable[[], object] | None = None
        self.instance: object | None = None
        self.lock = threading.Lock()


_DEFAULTS: dict[str, _Default] = {REPORT_RENDERER_ROLE: _Default(), BATCH_EXECUTOR_ROLE: _Default()}


def install_default(role: str, factory: Callable[[], object] | None) -> Callable[[], object] | None:
    """Use ``factory`` (zero arguments) for ``role`` from now on (``None`` removes the default);
    returns the previous factory. The composition root calls this without importing the records."""
    if role not in _DEFAULTS:
        raise ValueError(f"unknown collaborator role {role!r}; known: {', '.join(_DEFAULTS)}")
    slot = _DEFAULTS[role]
    with slot.lock:
        previous, slot.factory, slot.instance = slot.factory, factory, None
    return previous


class Collaborator(Generic[T]):
    """The typed view a record module has of one role's process-wide default.

    ``get()`` builds the collaborator with the installed factory on first use and keeps it;
    ``install(factory)`` (a test, an application with its own renderer) replaces the factory and
    returns the previous one.
    """

    def __init__(self, role: str, how_to_pass: str) -> None:
        if role not in _DEFAULTS:
            raise ValueError(f"unknown collaborator role {role!r}; known: {', '.join(_DEFAULTS)}")
        self.role = role
        self.how_to_pass = how_to_pass

    def install(self, factory: Callable[[], T] | None) -> Callable[[], object] | None:
        """Use ``factory`` from now on (``None`` removes the default); returns the previous factory."""
        return install_default(self.role, factory)

    def get(self) -> T:
        """The default collaborator. FrameworkInitializationError (DF001) when none is installed."""
        slot = _DEFAULTS[self.role]
        with slot.lock:
            if slot.instance is None:
                if slot.factory is None:
                    raise FrameworkInitializationError(
                        f"no default {self.role} is installed",
                        hint=f"import debug_framework (its __init__ installs the defaults), or {self.how_to_pass}",
                    )
                slot.instance = slot.factory()
            return cast(T, slot.instance)
