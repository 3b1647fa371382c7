"""Spec-facing fronts of backends for specific runtimes (``metal_backend.MetalBackend``), the
pytest plugin (``pytest_plugin``) and ``assert_backend_matches`` (``backend_check``).

Nothing is imported eagerly: the pytest plugin's entry point imports this package in every pytest
run, so it must stay light (``MetalBackend`` is imported on first use).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MetalBackend"]


def __getattr__(name: str) -> Any:
    if name == "MetalBackend":
        from .metal_backend import MetalBackend

        return MetalBackend
    raise AttributeError(f"module 'debug_framework.integrations' has no attribute {name!r}")
