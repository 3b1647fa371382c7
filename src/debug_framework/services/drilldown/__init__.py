"""Op-level drill-down: inside a layer that introduces error, which operator does (see :mod:`.types`)."""

from .types import Culprit, DrillRequest, DrillStrategy, LayerDrilldown, OperatorRow

__all__ = ["OperatorRow", "Culprit", "LayerDrilldown", "DrillRequest", "DrillStrategy"]
