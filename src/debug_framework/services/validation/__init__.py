"""Validation as a pipeline: the plan (:mod:`.plan`), the stages over a run context
(:mod:`.stages`) and the result types (:mod:`.results`). The engine that runs them is
:class:`debug_framework.services.validation_engine.ValidationEngine`."""

from .plan import MODEL_TOLERANCES, SESSION_DEFAULTS, ValidationPlan, resolve_tolerance
from .results import CheckpointOutcome, LayerIsolation, ValidationResult
from .stages import DEFAULT_STAGES, RunContext, Stage

__all__ = [
    "ValidationPlan",
    "SESSION_DEFAULTS",
    "MODEL_TOLERANCES",
    "resolve_tolerance",
    "Stage",
    "RunContext",
    "DEFAULT_STAGES",
    "ValidationResult",
    "CheckpointOutcome",
    "LayerIsolation",
]
