"""Op-level drill-down: inside a layer that introduces error, which operator does (see :mod:`.types`).

Strategies (:mod:`.registry`): ``onnx`` (:mod:`.onnx`, ONNX Runtime), ``openvino`` (:mod:`.openvino`), ``replay`` (:mod:`.replay`,
eager PyTorch, module and plugin backends), and those installed packages declare in the entry-point
group ``debug_framework.drill_strategies`` (:mod:`.entry_points`; ``debug_module``'s Inductor one).
"""

from .registry import STRATEGY_FACTORIES, choose_strategy
from .types import Culprit, DrillRequest, DrillStrategy, LayerDrilldown, OperatorRow

__all__ = ["OperatorRow", "Culprit", "LayerDrilldown", "DrillRequest", "DrillStrategy", "STRATEGY_FACTORIES",
           "choose_strategy"]
