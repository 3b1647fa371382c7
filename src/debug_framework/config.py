"""Framework configuration: defaults plus the ``PIE_DEBUG_*`` environment overrides.

Environment variables are read here, once, at the edge (``from_environment``); everything below
receives plain dictionaries. Nothing deep in the library reads ``os.environ``.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import FrameworkInitializationError
from .jsonio import JsonObject

__all__ = ["DEFAULT_CONFIG", "ENV_VARIABLES", "FLOAT_DTYPES", "from_environment", "merge_config",
           "default_database_path", "is_server_url", "database_settings", "check_keywords", "ResourceSettings",
           "resource_settings"]

#: The compute dtypes the framework knows by name (backends support a subset; defined here, torch-free,
#: so a CLI can refuse a bad ``--dtype`` before importing anything heavy).
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")

DEFAULT_CONFIG: JsonObject = {
    "database_path": "~/.pie/debug/debug_framework.db",
    "performance_monitoring": True,
    "auto_cleanup": True,
    "max_session_duration": 3600,
    "tensor_recording_limit": 100,
    "comparison_tolerance": {"rtol": 1e-4, "atol": 1e-6},
    "debug_enabled": False,
    "log_level": "WARNING",
    "metal_path": None,
    # resource management (docs/storage.md, "Maintenance"): how often a running session or batch
    # item renews its owner lease; how long finished sessions are kept (None: forever); how often,
    # at most, an engine start runs the automatic database optimisation (with auto_cleanup)
    "heartbeat_interval": 30,
    "retention_days": None,
    "maintenance_interval": 3600,
    # the shared folder of tensor files, saved inputs and exports when database_path is a
    # postgresql:// URL (docs/storage.md, "PostgreSQL"); SQLite keeps them beside its file
    "artifact_root": None,
    # the memory a session may need (bytes; None: what is available when it starts; "off": no
    # check): a session estimated above it is refused with DF007 before it runs (docs/scaling.md)
    "memory_budget": None,
    # the bytes of captured checkpoints a validation run keeps in memory: beyond it they are written
    # beside the tensor store as they are produced and read back memory-mapped (docs/scaling.md)
    "capture_memory_budget": 64 * 2**20,
}

#: Environment variable -> the config key it overrides (read by :func:`from_environment`).
ENV_VARIABLES: dict[str, str] = {
    "PIE_DEBUG_ENABLED": "debug_enabled",
    "PIE_DEBUG_LEVEL": "log_level",
    "PIE_DEBUG_DATABASE": "database_path",
    "PIE_METAL_PATH": "metal_path",
    "PIE_DEBUG_ARTIFACT_ROOT": "artifact_root",
    "PIE_DEBUG_MEMORY_BUDGET": "memory_budget",
    "PIE_DEBUG_CAPTURE_MEMORY": "capture_memory_budget",
}

_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in {"1", "true", "yes", "on"}:
        return True
    if v in {"0", "false", "no", "off", ""}:
        return False
    raise FrameworkInitializationError(
        f"{name}={value!r} is not a boolean", hint=f"set {name} to true or false", variable=name
    )


def _parse_level(name: str, value: str) -> str:
    level = value.strip().upper()
    if level not in _LEVELS:
        raise FrameworkInitializationError(
            f"{name}={value!r} is not a logging level", hint="use one of DEBUG, INFO, WARNING, ERROR", variable=name
        )
    return level


def _parse_path(name: str, value: str) -> str | None:
    return value or None  # an empty variable means "not set"


def _parse_size(name: str, value: str) -> int | str | None:
    """Bytes, or a number with K, M, G or T (powers of 1024; ``12G``, ``512MiB``); ``off``: no check."""
    v = value.strip()
    if not v:
        return None
    if v.lower() == "off":
        return "off"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", v, flags=re.IGNORECASE)
    if m is None:
        raise FrameworkInitializationError(f"{name}={value!r} is not a size", variable=name,
                                           hint=f"set {name} to bytes, a number with K, M, G or T (12G), or off")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


_PARSERS = {"debug_enabled": _parse_bool, "log_level": _parse_level, "database_path": _parse_path, "metal_path": _parse_path,
            "artifact_root": _parse_path, "memory_budget": _parse_size,
            "capture_memory_budget": _parse_size}


def from_environment(environ: Mapping[str, str] | None = None) -> JsonObject:
    """Read the variables of :data:`ENV_VARIABLES` from ``environ`` (default ``os.environ``).

    Raises:
        FrameworkInitializationError: a value that does not parse (DF001), naming the variable.
    """
    env = os.environ if environ is None else environ
    out: JsonObject = {}
    for variable, key in ENV_VARIABLES.items():
        if variable in env:
            value = _PARSERS[key](variable, env[variable])
            if value is not None:
                out[key] = value
    return out


def merge_config(*layers: Mapping[str, object] | None) -> dict[str, object]:
    """Later layers win; nested dicts merge key by key. Starts from a deep copy of DEFAULT_CONFIG."""
    result = copy.deepcopy(DEFAULT_CONFIG)
    for layer in layers:
        if not layer:
            continue
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(result.get(key), dict):
                result[key] = {**result[key], **value}
            else:
                result[key] = copy.deepcopy(value)
    return result


def is_server_url(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL server (``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and "://" in target and target.split("://", 1)[0].lower() in ("postgresql",
                                                                                                "postgres")


def default_database_path(config: Mapping[str, object]) -> Path | str:
    """The configured database path, with ``~`` expanded; a ``postgresql://`` URL as given."""
    raw = str(config.get("database_path") or DEFAULT_CONFIG["database_path"])
    return raw if is_server_url(raw) else Path(raw).expanduser()


def database_settings(config: Mapping[str, object]) -> dict[str, str]:
    """The database settings a config carries besides the path (``artifact_root`` for a server)."""
    root = config.get("artifact_root")
    return {"artifact_root": str(root)} if root else {}


def check_keywords(options: Mapping[str, object], spec: type, where: str) -> None:
    """Raise ``TypeError`` (as Python does for a bad keyword) when ``options`` holds a key that the
    ``TypedDict`` ``spec`` does not declare: ``**options: Unpack[spec]`` is only checked by type
    checkers, so a misspelt keyword would otherwise be silently ignored."""
    unknown = sorted(set(options) - set(spec.__annotations__))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(spec.__annotations__)}")


@dataclass(frozen=True)
class ResourceSettings:
    """The resource-management keys of a framework configuration, checked (see docs/storage.md)."""

    #: stale sessions swept and the database optimised on engine start
    auto_cleanup: bool
    #: seconds a validation may run (None: no limit)
    max_session_duration: float | None
    #: seconds between lease renewals of a running session or batch item
    heartbeat_interval: float
    #: days finished sessions are kept by maintenance (None: forever)
    retention_days: float | None
    #: the automatic optimisation runs at most once per this many seconds
    maintenance_interval: float
    #: sessions are profiled (False: no profiling at all, whatever a session asks)
    performance_monitoring: bool


def _number(config: Mapping[str, object], key: str, *, optional: bool, minimum: float = 0.0) -> float | None:
    value = config.get(key, DEFAULT_CONFIG[key])
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > minimum or value != value:
        what = f"a number > {minimum:g}" + (" or None" if optional else "")
        raise FrameworkInitializationError(f"config[{key!r}] must be {what}, got {value!r}", key=key,
                                           hint=f"set {key} to {what} (default {DEFAULT_CONFIG[key]!r})")
    return float(value)


def resource_settings(config: Mapping[str, object]) -> ResourceSettings:
    """The checked resource keys of ``config`` (DEFAULT_CONFIG's where absent); FrameworkInitializationError
    (DF001) naming the key for a value of the wrong kind. ``max_session_duration`` of 0 means no limit."""
    duration = config.get("max_session_duration", DEFAULT_CONFIG["max_session_duration"])
    return ResourceSettings(
        auto_cleanup=bool(config.get("auto_cleanup", DEFAULT_CONFIG["auto_cleanup"])),
        max_session_duration=None if duration in (None, 0) else _number(config, "max_session_duration", optional=True),
        heartbeat_interval=float(_number(config, "heartbeat_interval", optional=False) or 0.0),
        retention_days=_number(config, "retention_days", optional=True),
        maintenance_interval=float(_number(config, "maintenance_interval", optional=False, minimum=-1e-9) or 0.0),
        performance_monitoring=bool(config.get("performance_monitoring", DEFAULT_CONFIG["performance_monitoring"])),
    )
