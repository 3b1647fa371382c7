"""Parametrised backend names (``plugin:<id>``): prefix -> resolver, a torch-free table.

The backend registry (execution layer) reads it; the composition root (``debug_framework/__init__``
through ``services.wiring``) fills it, so ``plugin:<id>`` resolves through the plugin registry of the
services layer without the backends importing upward, and ``import debug_framework`` loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_backend_prefix", "prefix_resolver"]

#: ``resolver(rest) -> backend factory`` for names ``"<prefix>:<rest>"``.
_RESOLVERS: dict[str, Callable[[str], Any]] = {}


def register_backend_prefix(prefix: str, resolver: Callable[[str], Any]) -> None:
    """Resolve every backend name ``"<prefix>:<rest>"`` that is not registered itself by ``resolver(rest)``."""
    _RESOLVERS[prefix] = resolver


def prefix_resolver(name: str) -> tuple[Callable[[str], Any], str] | None:
    """``(resolver, rest)`` for a parametrised ``name``, or None."""
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in _RESOLVERS:
        return None
    return _RESOLVERS[prefix], rest
