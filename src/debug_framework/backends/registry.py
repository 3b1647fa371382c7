"""The backend registry: names -> factories, and a truthful availability report.

Built-in backends are listed in :data:`BUILTIN_BACKENDS` as ``"module:attribute"`` strings and
imported only when asked for, so a backend whose runtime is missing (onnxruntime, mlx, CUDA ...)
is reported unavailable with the import error as the reason instead of breaking the registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..backend_prefixes import prefix_resolver
from ..errors import BackendInitializationError
from .base import Backend

__all__ = [
    "BUILTIN_BACKENDS",
    "BackendFactory",
    "register_backend",
    "unregister_backend",
    "registered_backends",
    "get_backend",
    "backend_availability",
    "detect_available_backends",
    "AUTO_ORDER",
    "select_alternative",
    "backend_versions",
]

#: ``factory(**options) -> Backend``. A class is a factory.
BackendFactory = Callable[..., Backend]

#: Built-in backends: name -> "module:attribute" of the factory, imported lazily.
BUILTIN_BACKENDS: dict[str, str] = {
    "python_reference": "debug_framework.backends.python_reference:PythonReferenceBackend",
    "pytorch": "debug_framework.backends.pytorch:PyTorchBackend",
    "inductor": "debug_framework.backends.inductor:InductorBackend",
    "onnxruntime": "debug_framework.backends.onnx_runtime:OnnxRuntimeBackend",
    "mlx": "debug_framework.backends.mlx_backend:MLXBackend",
    "metal": "debug_framework.backends.mlx_backend:MLXMetalBackend",
    "cuda": "debug_framework.backends.cuda:CudaBackend",
}

#: Preference of ``alternative_backend="auto"`` (see docs/backends-more.md): GPU backends first
#: (the hardware a model is deployed on, and the most different arithmetic), then the CPU backends
#: whose code is furthest from eager PyTorch: Inductor's generated kernels, ONNX Runtime's
#: optimised graph, the independent MLX implementation, and eager PyTorch itself.
AUTO_ORDER: tuple[str, ...] = ("cuda", "metal", "inductor", "onnxruntime", "mlx", "pytorch", "python_reference")

_FACTORIES: dict[str, BackendFactory | str] = dict(BUILTIN_BACKENDS)


def register_backend(name: str, factory: BackendFactory | str, *, replace: bool = False) -> None:
    """Register ``factory`` (a callable or a lazy ``"module:attribute"`` string) under ``name``.

    Raises:
        BackendInitializationError: ``name`` is taken and ``replace`` is False (DF002).
    """
    if not name or not isinstance(name, str):
        raise BackendInitializationError(f"invalid backend name {name!r}", backend=str(name))
    if name in _FACTORIES and not replace:
        raise BackendInitializationError(
            "a backend of this name is already registered", hint="pass replace=True to override it", backend=name
        )
    _FACTORIES[name] = factory


def unregister_backend(name: str) -> None:
    """Remove ``name`` from the registry (built-ins included)."""
    _FACTORIES.pop(name, None)


def registered_backends() -> list[str]:
    """Registered names, registration order."""
    return list(_FACTORIES)


def _resolve(name: str) -> BackendFactory:
    parametrised = prefix_resolver(name) if name not in _FACTORIES else None
    if parametrised is not None:  # "plugin:<id>" (see debug_framework.backend_prefixes)
        resolver, rest = parametrised
        return resolver(rest)
    if name not in _FACTORIES:
        raise BackendInitializationError(
            "unknown backend", hint=f"registered backends: {', '.join(_FACTORIES)}", backend=name
        )
    factory = _FACTORIES[name]
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise BackendInitializationError(f"cannot import {factory}: {exc}", backend=name) from exc
    return factory


def get_backend(name: str, *, check: bool = True, **options: Any) -> Backend:
    """A new instance of backend ``name``; ``options`` go to its factory (e.g. ``device="cuda"``).

    Raises:
        BackendInitializationError: unknown name, failed import/construction, or (with ``check``)
            not available here, with the reason (DF002).
    """
    factory = _resolve(name)
    try:
        backend = factory(**options)
    except BackendInitializationError:
        raise
    except Exception as exc:
        raise BackendInitializationError(f"constructing the backend failed: {exc}", backend=name) from exc
    if check:
        ok, reason = backend.availability()
        if not ok:
            raise BackendInitializationError(f"backend is not available: {reason}", backend=name)
    return backend


def backend_availability() -> dict[str, tuple[bool, str]]:
    """Every registered backend -> ``(available, reason)``; the reason is empty when available."""
    report: dict[str, tuple[bool, str]] = {}
    for name in list(_FACTORIES):
        try:
            report[name] = tuple(get_backend(name, check=False).availability())  # type: ignore[assignment]
        except BackendInitializationError as exc:
            report[name] = (False, exc.message)
        except Exception as exc:  # an availability probe must not break the report
            report[name] = (False, f"availability check failed: {exc}")
    return report


def detect_available_backends() -> dict[str, bool]:
    """Every registered backend -> whether it can run here (reasons: :func:`backend_availability`)."""
    return {name: ok for name, (ok, _) in backend_availability().items()}


def select_alternative(
    reference: str,
    *,
    order: tuple[str, ...] | list[str] = AUTO_ORDER,
    availability: dict[str, tuple[bool, str]] | None = None,
) -> tuple[str, str]:
    """What ``alternative_backend="auto"`` means: the first available backend of ``order`` that is
    not ``reference``. Returns ``(name, reason)``; the reason says why it was picked and why the
    ones before it were not.

    Raises:
        BackendInitializationError: no backend other than the reference can run here (DF002).
    """
    report = backend_availability() if availability is None else availability
    skipped: list[str] = []
    for name in order:
        if name == reference:
            skipped.append(f"{name}: it is the reference")
            continue
        ok, why = report.get(name, (False, "not registered"))
        if ok:
            reason = f"auto picked {name!r} (first available in {' > '.join(order)})"
            return name, reason + ("; skipped " + "; ".join(skipped) if skipped else "")
        skipped.append(f"{name}: {why}")
    raise BackendInitializationError(
        "no alternative backend is available", hint="; ".join(skipped) or "register a backend", backend="auto"
    )


def backend_versions(backend: Backend) -> dict[str, Any]:
    """``backend.version_info()`` when it has one, else what can be said (its name and type)."""
    info = getattr(backend, "version_info", None)
    if callable(info):
        return dict(info())
    return {"backend": getattr(backend, "name", type(backend).__name__), "type": type(backend).__qualname__}
