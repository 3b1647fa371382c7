"""Backends: the ``Backend`` protocol, the engine registry (one :class:`Engine` record per engine;
each runtime engine one package under ``backends/``), and the built-in and user backends.

    from debug_framework.backends import get_backend
    ref = get_backend("python_reference"); ref.prepare(model, "float64")
    alt = get_backend("pytorch"); alt.prepare(model, "float32", "cpu")
    a, b = ref.run(inputs), alt.run(inputs)      # Capture: CheckpointKey -> tensor
"""

from .base import Backend, BaseBackend, Taps
from .registry import (
    AUTO_ORDER,
    BUILTIN_BACKENDS,
    BUILTIN_ENGINES,
    BackendFactory,
    Engine,
    backend_availability,
    backend_versions,
    detect_available_backends,
    get_backend,
    register_backend,
    register_engine,
    registered_backends,
    select_alternative,
    unregister_backend,
)
from .user import module_backend, user_backend

__all__ = [
    "Backend",
    "BaseBackend",
    "Taps",
    "BackendFactory",
    "BUILTIN_BACKENDS",
    "Engine",
    "BUILTIN_ENGINES",
    "register_engine",
    "register_backend",
    "unregister_backend",
    "registered_backends",
    "get_backend",
    "backend_availability",
    "detect_available_backends",
    "AUTO_ORDER",
    "select_alternative",
    "backend_versions",
    "user_backend",
    "module_backend",
]
