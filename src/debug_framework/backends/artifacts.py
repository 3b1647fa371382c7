"""Where a backend keeps the files a run produces (exported graphs, their logs).

While the validation engine runs a session it sets that session's artifact root
(``<db dir>/<db name>_artifacts/<session id>/``, see
:meth:`~debug_framework.services.validation_engine.ValidationEngine.session_artifact_dir`). A backend
that writes files and was given no directory of its own claims one there with
:func:`claim_artifact_dir` (``<root>/<backend name>``; ``<root>/<backend name>-2`` for a second one in the
same session), so the files stay with the session and its record names them. Outside such a run
there is no root: the backend uses a temporary directory that it removes itself.

    with artifact_root(tmp / "session-1"):
        backend.prepare(model)           # exports into tmp/session-1/<backend name>/
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

__all__ = ["artifact_root", "current_artifact_root", "claim_artifact_dir", "run_directory"]

_ROOT: ContextVar[Path | None] = ContextVar("debug_framework_artifact_root", default=None)


@contextlib.contextmanager
def artifact_root(path: str | os.PathLike[str] | None) -> Iterator[Path | None]:
    """Within the block, backends without a directory of their own keep their files under ``path``
    (``None``: no root, as outside any session). Nothing is created until a backend claims a directory."""
    root = None if path is None else Path(path)
    token = _ROOT.set(root)
    try:
        yield root
    finally:
        _ROOT.reset(token)


def current_artifact_root() -> Path | None:
    """The root set by the innermost :func:`artifact_root` block, or ``None``."""
    return _ROOT.get()


def claim_artifact_dir(name: str) -> Path | None:
    """A new directory ``<root>/<name>`` (``<name>-2``, ``-3`` ... where taken) under the current
    root, created; ``None`` when there is no root. ``name`` is a backend's registered name, never
    user text. Raises ``OSError`` when the directory cannot be created."""
    root = _ROOT.get()
    if root is None:
        return None
    root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = root / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")  # pragma: no cover


def run_directory(owner: object, given: Path | None, name: str, prefix: str) -> tuple[Path, weakref.finalize | None]:
    """The directory a backend ``owner`` (registered as ``name``) keeps its run's files in, created:
    ``given``, else one claimed under the session's root (:func:`claim_artifact_dir`), else a new
    temporary ``<prefix>*`` directory removed when ``owner`` is collected (the finalizer returned
    with it, None otherwise). Raises ``BackendInitializationError`` (DF002) naming the directory
    where it cannot be created."""
    from ..errors import BackendInitializationError

    finalizer = None
    try:
        path = given if given is not None else claim_artifact_dir(name)
    except OSError as exc:
        raise BackendInitializationError(f"cannot create the session's artifact directory: {exc}",
                                         backend=name) from exc
    if path is None:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        finalizer = weakref.finalize(owner, shutil.rmtree, str(path), ignore_errors=True)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendInitializationError(f"cannot create the artifact directory {path}: {exc}", backend=name) from exc
    return path, finalizer
