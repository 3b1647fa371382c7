"""The exception tree of the framework.

Every error a user can cause carries a ``DFnnn`` code, says what failed (and where, when a
file, tensor, backend or checkpoint is involved) and what to do about it::

    DebugFrameworkError                    (base; code DF000 only when raised directly)
    ├── FrameworkInitializationError       DF001
    ├── BackendInitializationError         DF002
    │   └── UnsupportedTorchVersionError   DF002 (the installed PyTorch is outside the checked range)
    ├── DatabaseError                      DF003
    ├── ModelLoadingError                  DF004
    ├── ValidationError                    DF005 (a validation that cannot execute: a session in the wrong
    │   │                                        state, a job another process is running ...)
    │   ├── ConfigurationError             DF005 (the user's bad option, configuration value, input or
    │   │                                        path, an output file that cannot be written included)
    │   └── BackendRuntimeError            DF005 (a backend failing mid-run; names the backend and the call)
    ├── ComparisonError                    DF006
    ├── ResourceExhaustedError             DF007
    └── PluginCompilationError             DF008

The three DF005 classes tell who has to act: ``ConfigurationError`` the user (change the option,
the file or the path named in the message), ``BackendRuntimeError`` whoever owns the backend (its
exception is the ``__cause__``), a plain ``ValidationError`` nobody's input (wait, or start a new
session). All three are caught by ``except ValidationError``. A numerical failure (a checkpoint out
of tolerance) is never an exception: it is the result (``passed``/``verdict``, exit 1 from a CLI).
"""

from __future__ import annotations

import errno

from .termtext import terminal_safe

__all__ = [
    "DebugFrameworkError",
    "FrameworkInitializationError",
    "BackendInitializationError",
    "UnsupportedTorchVersionError",
    "DatabaseError",
    "ModelLoadingError",
    "ValidationError",
    "ConfigurationError",
    "BackendRuntimeError",
    "ComparisonError",
    "ResourceExhaustedError",
    "PluginCompilationError",
    "ERROR_CODES",
    "NO_SPACE_ERRNOS",
    "no_space_error",
    "unwritable_output",
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

    def __init__(self, message: str, *, hint: str | None = None, **context: object) -> None:
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
        return terminal_safe(text)  # a path or name in it never moves the cursor of the terminal showing it

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle the state, not the constructor's arguments: an error crosses to another process
        (a batch worker, a Ray task) as it is, whatever its subclass's ``__init__`` takes."""
        return (_restore_error, (type(self), self.args, self.__dict__.copy()))

    def to_dict(self) -> dict[str, str | dict[str, str]]:
        """JSON-ready form, used by CLIs with ``--json``."""
        return {
            "code": self.code,
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "context": {k: str(v) for k, v in self.context.items()},
        }


def _restore_error(cls: type[DebugFrameworkError], args: tuple[object, ...], state: dict[str, object]) -> DebugFrameworkError:
    """Rebuild a pickled framework error without calling its ``__init__`` (see ``__reduce__``)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


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
    """A validation that cannot execute. Raised as such for a state that forbids it (a session that
    is not ``created``, a running session, a batch job another process executes); the user's bad
    input is :class:`ConfigurationError` and a backend failing mid-run :class:`BackendRuntimeError`,
    both subclasses (DF005)."""

    code = "DF005"
    title = "Validation failed to execute"
    default_hint = "see the message; the session record keeps what completed before the failure"


class ConfigurationError(ValidationError):
    """The user's bad input (DF005): an option or configuration value out of range or of the wrong
    type, an unknown key or name, a file that is not what it should be, or an output path that
    cannot be written (a report, an export; no room to write there is :class:`ResourceExhaustedError`,
    DF007). Nothing has run when it is raised for an option; the user fixes what the message names."""

    title = "Invalid option or input"
    default_hint = "correct the option, file or path named in the message and run again"


class BackendRuntimeError(ValidationError):
    """A backend failing mid-run (DF005): an exception out of its ``prepare``, ``run`` or
    ``run_layer``, or a result it returned that cannot be used. ``backend`` and ``call`` name them;
    the backend's own exception, if any, is the ``__cause__``. Not the user's input, and not a
    numerical failure (that is a failed checkpoint in the result)."""

    title = "Backend failed during the run"
    default_hint = ("fix or report the backend (its own exception is kept as this error's cause); "
                    "the session keeps every row written before it failed")

    def __init__(self, message: str, *, backend: str, call: str, hint: str | None = None,
                 **context: object) -> None:
        self.backend = backend
        self.call = call
        super().__init__(message, hint=hint, backend=backend, call=call, **context)

    @classmethod
    def from_exception(cls, backend: str, call: str, exc: BaseException, **context: object) -> BackendRuntimeError:
        """The error for ``exc`` raised by ``backend`` in ``call`` (raise it ``from exc``)."""
        return cls(f"backend {backend!r} failed in {call}: {type(exc).__name__}: {exc}",
                   backend=backend, call=call, **context)


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
                   **context: object) -> ResourceExhaustedError | None:
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


def unwritable_output(exc: OSError, what: str, *, hint: str,
                      **context: object) -> ResourceExhaustedError | ConfigurationError:
    """The error for an output the user asked for (a report, an export) that cannot be written while
    doing ``what``: DF007 when there is no room to write (:func:`no_space_error`), else
    :class:`ConfigurationError`, since the path itself is unusable (a directory, no permission, a
    parent that is a file) and the user's fix is another path (``hint`` says which option).
    Raise it ``from exc``."""
    full = no_space_error(exc, what, **context)
    if full is not None:
        return full
    return ConfigurationError(f"cannot {what}: {exc}", hint=hint, **context)
