"""Multi-Backend Debug Framework: validate a model's backends against a reference."""

from .config import DEFAULT_CONFIG
from .errors import (
    BackendInitializationError,
    ComparisonError,
    DatabaseError,
    DebugFrameworkError,
    FrameworkInitializationError,
    ModelLoadingError,
    PluginCompilationError,
    ResourceExhaustedError,
    ValidationError,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CONFIG",
    "DebugFrameworkError",
    "FrameworkInitializationError",
    "BackendInitializationError",
    "DatabaseError",
    "ModelLoadingError",
    "ValidationError",
    "ComparisonError",
    "ResourceExhaustedError",
    "PluginCompilationError",
]
