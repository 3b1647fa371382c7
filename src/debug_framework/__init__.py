"""Multi-Backend Debug Framework: validate a model's backends against a reference.

    import debug_framework as df

    engine = df.ValidationEngine("/tmp/debug.db")
    sid = engine.create_session("path/to/model", {"isolate": True}, "python_reference", "auto")
    result = engine.run(sid)                      # a ValidationResult
    result.verdict, result.first_divergence

    df.compare(reference_tensor, other_tensor, rtol=1e-4, atol=1e-5).summary()
    df.register_backend("mine", df.user_backend("mine", build_runner))
    df.assert_backend_matches("path/to/model", "mine", dtype="float32")   # in a test: AssertionError on a mismatch

The names here are the public API; everything else is reached through its module
(``debug_framework.services.validation_engine``, ``debug_framework.reports``, ...). The heavy ones
(the engine, the comparison core, the backends) are imported on first use, so ``import
debug_framework`` stays fast.

Environment variables (``PIE_DEBUG_ENABLED``, ``PIE_DEBUG_LEVEL``, ``PIE_DEBUG_DATABASE``,
``PIE_METAL_PATH``) are read once, here at the edge, by :func:`initialize_framework` or the first
:func:`get_framework_config`; everything below receives the configuration as a plain dict.
"""

from __future__ import annotations

import copy
import logging
import os
import platform
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .config import DEFAULT_CONFIG, database_settings, default_database_path, from_environment, merge_config
from .errors import (
    BackendInitializationError,
    BackendRuntimeError,
    ComparisonError,
    ConfigurationError,
    DatabaseError,
    DebugFrameworkError,
    FrameworkInitializationError,
    ModelLoadingError,
    PluginCompilationError,
    ResourceExhaustedError,
    ValidationError,
)
from .jsonio import JsonObject, JsonValue

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .backends import Backend, get_backend, module_backend, register_backend, user_backend
    from .comparison import ComparisonResult, Tolerance, compare
    from .integrations.backend_check import BackendMismatch, assert_backend_matches
    from .modelio import LoadedModel, ModelInputs, load_model
    from .services.validation_engine import ValidationEngine, ValidationResult

#: Public names imported on first use: name -> module that defines it.
_LAZY: dict[str, str] = {
    "ValidationEngine": "debug_framework.services.validation_engine",
    "ValidationResult": "debug_framework.services.validation_engine",
    "compare": "debug_framework.comparison",
    "ComparisonResult": "debug_framework.comparison",
    "Tolerance": "debug_framework.comparison",
    "Backend": "debug_framework.backends",
    "register_backend": "debug_framework.backends",
    "get_backend": "debug_framework.backends",
    "user_backend": "debug_framework.backends",
    "module_backend": "debug_framework.backends",
    "load_model": "debug_framework.modelio",
    "assert_backend_matches": "debug_framework.integrations.backend_check",
    "BackendMismatch": "debug_framework.integrations.backend_check",
    "LoadedModel": "debug_framework.modelio",
    "ModelInputs": "debug_framework.modelio",
}

__all__ = [
    # validating
    "ValidationEngine",
    "ValidationResult",
    "create_validation_session",
    "assert_backend_matches",
    "BackendMismatch",
    # comparing
    "compare",
    "ComparisonResult",
    "Tolerance",
    # models and backends
    "load_model",
    "LoadedModel",
    "ModelInputs",
    "Backend",
    "register_backend",
    "get_backend",
    "user_backend",
    "module_backend",
    "detect_available_backends",
    # configuration
    "DEFAULT_CONFIG",
    "initialize_framework",
    "get_framework_config",
    "get_system_info",
    # errors
    "DebugFrameworkError",
    "FrameworkInitializationError",
    "BackendInitializationError",
    "DatabaseError",
    "ModelLoadingError",
    "ValidationError",
    "ConfigurationError",
    "BackendRuntimeError",
    "ComparisonError",
    "ResourceExhaustedError",
    "PluginCompilationError",
]

# The composition root: records (debug_framework.models) never import the layers above them; their
# spec methods that need one (rendering a report, executing a batch) use defaults installed here.
# The factories import reports/services on first use only.
from .services.wiring import install_record_collaborators as _install_record_collaborators  # noqa: E402

_install_record_collaborators()

# "plugin:<id>" backends resolve through the plugin registry (services), installed here likewise.
from .services.wiring import install_backend_resolvers as _install_backend_resolvers  # noqa: E402

_install_backend_resolvers()

_STATE_LOCK = threading.Lock()
_CONFIG: JsonObject | None = None
_ENVIRONMENT: JsonObject | None = None


def _environment() -> JsonObject:
    """The PIE_* overrides, read from ``os.environ`` once per process."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = from_environment(os.environ)
    return _ENVIRONMENT


def _shown_database(config: Mapping[str, JsonValue]) -> str:
    """The configured database as messages and reports show it (a server URL without its password)."""
    from .storage.postgres import is_server_url, redact_url

    path = default_database_path(config)
    return redact_url(path) if is_server_url(path) else str(path)


def initialize_framework(config: Mapping[str, JsonValue] | None = None) -> bool:
    """Set the framework configuration: ``DEFAULT_CONFIG``, then the ``PIE_DEBUG_*`` /
    ``PIE_METAL_PATH`` environment, then ``config`` (explicit arguments win), and open the database
    to check it is usable. Returns True.

    Raises:
        FrameworkInitializationError (DF001): an unknown key, a bad environment value, or a
            database that cannot be opened (the cause is kept).
    """
    global _CONFIG
    unknown = set(config or {}) - set(DEFAULT_CONFIG)
    if unknown:
        raise FrameworkInitializationError(
            f"unknown configuration key(s) {sorted(unknown)}", hint=f"known keys: {', '.join(DEFAULT_CONFIG)}"
        )
    merged = merge_config(_environment(), config)
    try:
        from .storage.database import Database

        Database(default_database_path(merged), **database_settings(merged)).close()
    except DebugFrameworkError as exc:
        raise FrameworkInitializationError(f"the database cannot be used: {exc.message}",
                                           database=_shown_database(merged)) from exc
    logging.getLogger("debug_framework").setLevel(str(merged.get("log_level") or "WARNING"))
    with _STATE_LOCK:
        _CONFIG = merged
    return True


def get_framework_config() -> JsonObject:
    """The current configuration (a copy): what :func:`initialize_framework` set, else the
    defaults with the environment overrides."""
    with _STATE_LOCK:
        if _CONFIG is not None:
            return copy.deepcopy(_CONFIG)
    return merge_config(_environment())


def detect_available_backends() -> dict[str, bool]:
    """Every registered backend -> whether it can run here (reasons: ``backends.backend_availability()``)."""
    from .backends import detect_available_backends as detect

    return detect()


def get_system_info() -> JsonObject:
    """Platform, versions, CPU/GPU, backend availability (with reasons) and the configuration in use."""
    info: JsonObject = {
        "framework_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    for mod in ("numpy", "torch", "transformers", "numba"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional packages
            info[mod] = None
    try:
        import torch

        info["cuda_available"] = bool(torch.cuda.is_available())
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["mps_available"] = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    except Exception:  # noqa: BLE001
        info["cuda_available"] = False
    from .backends import backend_availability

    info["backends"] = {name: {"available": ok, "reason": reason} for name, (ok, reason) in backend_availability().items()}
    cfg = get_framework_config()
    info["database_path"] = _shown_database(cfg)
    if info["database_path"] != str(default_database_path(cfg)):  # a server URL: shown without its password
        cfg = {**cfg, "database_path": info["database_path"]}
    info["config"] = cfg
    return info


def create_validation_session(
    model_path: str | os.PathLike[str],
    reference_backend: str = "auto",
    alternative_backend: str = "auto",
    config: Mapping[str, JsonValue] | None = None,
) -> str:
    """Create a validation session in the configured database and return its id.

    ``alternative_backend="auto"`` picks the best backend available here (the registry's selection).
    ``config`` holds session keys (``enabled_checkpoints``, ``precision_thresholds``, ``isolate``,
    ...; see docs/validation.md). Run it with ``ValidationEngine(config=get_framework_config()).run(id)``.

    Raises:
        BackendInitializationError (DF002), ModelLoadingError (DF004), ConfigurationError (DF005, a bad configuration).
    """
    from .services.validation_engine import ValidationEngine

    engine = ValidationEngine(config=get_framework_config())
    return engine.create_session(model_path, config, reference_backend, alternative_backend)


def __getattr__(name: str) -> Any:
    """Import a public name (see ``_LAZY``) on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'debug_framework' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
