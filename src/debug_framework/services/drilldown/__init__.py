"""Op-level drill-down: inside a layer that introduces error, which operator does (see :mod:`.types`).

Strategies (:mod:`.registry`): ``replay`` (:mod:`.replay`, eager PyTorch, module and plugin
backends); others append their factory to :data:`.registry.STRATEGY_FACTORIES`.
"""

from .registry import STRATEGY_FACTORIES, choose_strategy
from .types import Culprit, DrillRequest, DrillStrategy, LayerDrilldown, OperatorRow

__all__ = ["OperatorRow", "Culprit", "LayerDrilldown", "DrillRequest", "DrillStrategy", "STRATEGY_FACTORIES",
           "choose_strategy"]
