"""Mock accelerator backend (eager validation mode)."""

from .mock import MockBackend, make_mock_backend, mock_backend

__all__ = ["MockBackend", "mock_backend", "make_mock_backend"]
