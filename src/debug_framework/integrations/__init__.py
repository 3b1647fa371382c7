"""Spec-facing fronts of backends for specific runtimes (``metal_backend.MetalBackend``)."""

from .metal_backend import MetalBackend

__all__ = ["MetalBackend"]
