"""The exception tree of the framework.

Every error a user can cause carries a ``DFnnn`` code, says what failed (and where, when a
file, tensor, backend or checkpoint is involved) and what to do about it::

    DebugFrameworkError                    (base; code DF000 only when raised directly)
    ├── FrameworkInitializationError       DF001
    ├── BackendInitializationError         DF002
    │   └── UnsupportedTorchVersionError   DF002 (the installed PyTorch is outside the checked range)
    ├── DatabaseError                      DF003
    ├── ModelLoadingError                  DF004
    ├── ValidationError                    DF005
    ├── ComparisonError                    DF006
    ├── ResourceExhaustedError             DF007
    └── PluginCompilationError             DF008
"""

from __future__ import annotations

import errno
from typing import Any

__all__ = [
    "DebugFrameworkError",
    "FrameworkInitializationError",
    "BackendInitializationError",
    "UnsupportedTorchVersionError",
    "DatabaseError",
    "ModelLoadingError",
    "ValidationError",
    "ComparisonError",
    "ResourceExhaustedError",
    "PluginCompilationError",
    "ERROR_CODES",
    "NO_SPACE_ERRNOS",
    "no_space_error",
]


class DebugFrameworkError(Exception):
    """Base of every framework error.

    Args:
        message: what failed, in one sentence.
        hint: what the user can do about it.
        **context: where it failed (``file=``, ``tensor=``, ``backend=``, ``checkpoint=`` ...);
            kept on ``.context`` and shown in the message.
    """

    code: str = "DF000"
    title: str = "Debug framework error"
    default_hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.context = {k: v for k, v in context.items() if v is not None}
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"[{self.code}] {self.title}: {self.message}"
        if self.context:
            where = ", ".join(f"{k}={v}" for k, v in self.context.items())
            text += f" ({where})"
        if self.hint:
            text += f". What to do: {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, used by CLIs with ``--json``."""
        return {
            "code": self.code,
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "context": {k: str(v) for k, v in self.context.items()},
        }


class FrameworkInitializationError(DebugFrameworkError):
    """A bad configuration key or ``PIE_DEBUG_*`` value, or a database the framework cannot open at start."""

    code = "DF001"
    title = "Framework initialization failed"
    default_hint = "check the configuration keys and the PIE_DEBUG_* environment variables"


class BackendInitializationError(DebugFrameworkError):
    """An unknown backend, one that cannot run here (with the reason), or one that failed to prepare."""

    code = "DF002"
    title = "Backend initialization failed"
    default_hint = "run detect_available_backends() to see which backends can run here and why not"


class UnsupportedTorchVersionError(BackendInitializationError):
    """The private-PyTorch-API layer (``debug_framework._torch``) was not checked against this torch."""

    title = "Unsupported PyTorch version"
    default_hint = (
        "install a supported torch (see debug_framework._torch.SUPPORTED_TORCH_RANGES) or extend the range "
        "after checking the private-API modules in debug_framework/_torch/"
    )


class DatabaseError(DebugFrameworkError):
    """The session database cannot be opened, migrated, read or written (the cause is kept)."""

    code = "DF003"
    title = "Database failure"
    default_hint = "check that the database path is writable (PIE_DEBUG_DATABASE or config['database_path'])"


class ModelLoadingError(DebugFrameworkError):
    """A model that cannot be loaded: missing path, unknown format, corrupt file, shape contradicting the config."""

    code = "DF004"
    title = "Model loading failed"
    default_hint = (
        "point at a Hugging Face directory (config.json + *.safetensors), a .safetensors file or a "
        ".zt file with a config.json beside it"
    )


class ValidationError(DebugFrameworkError):
    """A validation that cannot execute: bad inputs or configuration, or a backend failing mid-run."""

    code = "DF005"
    title = "Validation failed to execute"
    default_hint = "see the message; the session record keeps what completed before the failure"


class ComparisonError(DebugFrameworkError):
    """Inputs that cannot be compared numerically (wrong types, structures that do not match)."""

    code = "DF006"
    title = "Numerical comparison failed"
    default_hint = "pass torch tensors, NumPy arrays, or nested dicts/lists/tuples/dataclasses of them"


class ResourceExhaustedError(DebugFrameworkError):
    """A recording limit, memory or disk exhausted."""

    code = "DF007"
    title = "Resource exhausted"
    default_hint = "lower tensor_recording_limit, the byte budget, the batch size, or free disk/memory"


class PluginCompilationError(DebugFrameworkError):
    """A kernel plugin that fails to compile or to validate."""

    code = "DF008"
    title = "Plugin compilation failed"
    default_hint = "check the compiler output above and that the toolchain for the backend is installed"


ERROR_CODES: dict[str, type[DebugFrameworkError]] = {
    cls.code: cls
    for cls in (
        FrameworkInitializationError,
        BackendInitializationError,
        DatabaseError,
        ModelLoadingError,
        ValidationError,
        ComparisonError,
        ResourceExhaustedError,
        PluginCompilationError,
    )
}


#: ``errno`` values that mean "there is no room to write here": a full disk, an exhausted quota, the
#: file-size limit (``RLIMIT_FSIZE``) and a read-only file system. All of them are DF007.
NO_SPACE_ERRNOS: frozenset[int] = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def no_space_error(exc: BaseException, what: str, *, hint: str | None = None,
                   **context: Any) -> ResourceExhaustedError | None:
    """The DF007 for an ``OSError`` that means no room to write while doing ``what`` (None for any other error).

    Callers raise it ``from exc`` and keep what they already stored: ``raise err from exc``.
    """
    if not isinstance(exc, OSError) or exc.errno not in NO_SPACE_ERRNOS:
        return None
    why = "the file system is read-only" if exc.errno == errno.EROFS else "no space left"
    return ResourceExhaustedError(
        f"cannot {what}: {why} ({exc.strerror or exc})",
        hint=hint or "free disk space (or raise the quota / make the location writable) and run again; "
                     "everything stored before this point is kept",
        **context,
    )
