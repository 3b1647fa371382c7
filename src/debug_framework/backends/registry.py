"""The backend registry: names -> factories, and a truthful availability report.

Built-in backends are listed in :data:`BUILTIN_BACKENDS` as ``"module:attribute"`` strings and
imported only when asked for, so a backend whose runtime is missing (onnxruntime, mlx, CUDA ...)
is reported unavailable with the import error as the reason instead of breaking the registry.
Installed packages add backends through the entry-point group :data:`ENTRY_POINT_GROUP`, read once
per process on first use (so spawned batch workers find them too), equally lazily.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from ..backend_prefixes import prefix_resolver
from ..errors import BackendInitializationError
from ..suggest import did_you_mean
from .base import Backend

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
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
    "float64_eager": "debug_framework.backends.eager_reference:EagerReferenceBackend",
    "inductor": "debug_framework.backends.inductor:InductorBackend",
    "onnxruntime": "debug_framework.backends.onnx_runtime:OnnxRuntimeBackend",
    "openvino": "debug_framework.backends.openvino_backend:OpenVinoBackend",
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

#: The entry-point group of installed backends: ``name = "package.module:factory"``.
ENTRY_POINT_GROUP = "debug_framework.backends"
_entry_points_read = False
_entry_points_lock = threading.Lock()

_HOW_TO_REGISTER = (
    "register one with debug_framework.backends.register_backend(name, factory) in a module given to "
    "debug_validate --backend-module pkg.mod or --backend-file path.py, or install a package declaring it "
    f"in the entry-point group {ENTRY_POINT_GROUP!r}"
)


def _read_entry_points() -> None:
    """Add the backends installed packages declare in :data:`ENTRY_POINT_GROUP` (once per process).

    Each is kept as its lazy ``"module:attribute"`` string, imported when asked for like a built-in.
    A name already registered (a built-in, or registered before the first lookup) is kept.
    """
    global _entry_points_read
    if _entry_points_read:
        return
    from importlib.metadata import entry_points

    with _entry_points_lock:
        if not _entry_points_read:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                _FACTORIES.setdefault(ep.name, ep.value.split("[")[0].strip())
            _entry_points_read = True


def _unknown_backend(name: str) -> BackendInitializationError:
    """DF002 for a name nobody registered: the registered names, the closest one, how to register."""
    return BackendInitializationError(
        "unknown backend" + did_you_mean(name, _FACTORIES),
        hint=f"registered backends: {', '.join(_FACTORIES)}; {_HOW_TO_REGISTER}", backend=name,
    )


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
    """Registered names, registration order (built-ins, then installed entry points)."""
    _read_entry_points()
    return list(_FACTORIES)


def _resolve(name: str) -> BackendFactory:
    _read_entry_points()
    parametrised = prefix_resolver(name) if name not in _FACTORIES else None
    if parametrised is not None:  # "plugin:<id>" (see debug_framework.backend_prefixes)
        resolver, rest = parametrised
        return resolver(rest)
    if name not in _FACTORIES:
        raise _unknown_backend(name)
    factory = _FACTORIES[name]
    if isinstance(factory, str):
        spec = factory
        module, _, attr = spec.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):  # an entry point may name a nested attribute
                obj = getattr(obj, part)
        except Exception as exc:  # noqa: BLE001 - a runtime or package that fails to import: unavailable
            raise BackendInitializationError(f"cannot import {spec}: {type(exc).__name__}: {exc}",
                                             backend=name) from exc
        factory = obj
    return factory


def get_backend(name: str, *, check: bool = True, **options: Any) -> Backend:
    """A new instance of backend ``name``; ``options`` go to its factory (e.g. ``device="cuda"``).

    Raises:
        BackendInitializationError: unknown name, failed import/construction, or (with ``check``)
            not available here, with the reason (DF002).
    """
    factory = _resolve(name)
    _check_options(name, factory, options)
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


def backend_options(factory: Any) -> list[str] | None:
    """The keyword options ``factory`` takes (a backend class's ``__init__``, or a function); None
    where it takes any (``**kwargs``) or its signature cannot be read."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]


def _check_options(name: str, factory: Any, options: dict[str, Any]) -> None:
    """DF002 naming an option the backend does not take, and the ones it does."""
    known = backend_options(factory)
    if known is None:
        return
    for key in options:
        if key not in known:
            raise BackendInitializationError(
                f"backend {name!r} has no option {key!r}" + did_you_mean(key, known), backend=name,
                hint=f"its options: {', '.join(known)}" if known else "it takes no options")


def backend_availability() -> dict[str, tuple[bool, str]]:
    """Every registered backend -> ``(available, reason)``; the reason is empty when available."""
    report: dict[str, tuple[bool, str]] = {}
    for name in registered_backends():
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
