"""Which reference a session runs (``reference_for``) and the float64 oracle of a model
(``oracle_for``): names only, so choosing a reference imports no backend (an ONNX file's session
never imports torch). ``eager_reference`` re-exports them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..modelio.loader import LoadedModel

__all__ = ["FLOAT64_EAGER", "FROM_MATH", "reference_for", "oracle_for"]

#: The name of the generic tier's reference, everywhere (backend, session, JSON, report).
FLOAT64_EAGER = "float64_eager"
#: The name of the references written from the math.
FROM_MATH = "python_reference"


def reference_for(requested: str, model: LoadedModel) -> tuple[str, str]:
    """The reference backend of a session: ``"auto"`` is ``python_reference`` where a reference
    written from the math exists for the model, else ``float64_eager``; ``(name, why)``."""
    if requested != "auto":
        return requested, "requested"
    if model.architecture == "generic":
        why = getattr(model.config, "why_generic", "") or "no reference written from the math"
        return FLOAT64_EAGER, f"{FLOAT64_EAGER}: {why}"
    if getattr(model, "format", None) == "onnx":
        return FROM_MATH, f"{FROM_MATH}: the ONNX file's own graph in float64"
    return FROM_MATH, f"{FROM_MATH}: a reference written from the math exists for {model.config.model_type}"


def oracle_for(model: LoadedModel) -> str:
    """The float64 oracle of a model: the from-math reference where one exists, else ``float64_eager``."""
    return FLOAT64_EAGER if model.architecture == "generic" else FROM_MATH
