"""Op-level drill-down: inside a layer that introduces error, which operator does (the records and
the strategy protocol: :mod:`debug_framework.backends.drilldown.types`).

Strategies (:mod:`.registry`): each engine's own, named in its registry record and living in its
package under ``debug_framework/backends/``; the generic ``trace`` (:mod:`.trace`) and ``replay``
(:mod:`.replay`, eager PyTorch, module and plugin backends); and those installed packages declare
in the entry-point group ``debug_framework.drill_strategies`` (:mod:`.entry_points`;
``debug_module``'s Inductor one).
"""

from ...backends.drilldown.types import Culprit, DrillRequest, DrillStrategy, LayerDrilldown, OperatorRow
from .registry import STRATEGY_FACTORIES, choose_strategy

__all__ = ["OperatorRow", "Culprit", "LayerDrilldown", "DrillRequest", "DrillStrategy", "STRATEGY_FACTORIES",
           "choose_strategy"]
