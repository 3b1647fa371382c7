"""Validation as a pipeline: the plan (:mod:`.plan`), the stages that measure (:mod:`.stages`)
into the evidence (:mod:`.evidence`), the one judge (:mod:`.judge`) and the typed result
(:mod:`.results`). The engine that runs them is
:class:`debug_framework.services.validation_engine.ValidationEngine`."""

from .evidence import Evidence
from .judge import Judgement, Verdict, judge
from .plan import MODEL_TOLERANCES, SESSION_DEFAULTS, ValidationPlan, resolve_tolerance
from .results import CheckpointResult, LayerResult, ValidationResult
from .stages import DEFAULT_STAGES, RunContext, Stage

__all__ = [
    "ValidationPlan",
    "SESSION_DEFAULTS",
    "MODEL_TOLERANCES",
    "resolve_tolerance",
    "Stage",
    "RunContext",
    "DEFAULT_STAGES",
    "Evidence",
    "judge",
    "Judgement",
    "Verdict",
    "ValidationResult",
    "CheckpointResult",
    "LayerResult",
]
