"""AOTAutograd + Inductor backend with constraint checks and artifact capture."""

from .mock import AotMockBackend, aot_mock_backend, aot_mock_backend_default

__all__ = ["aot_mock_backend", "aot_mock_backend_default", "AotMockBackend"]
