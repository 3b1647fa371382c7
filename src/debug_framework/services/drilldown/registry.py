"""Which drill-down strategy sees inside which backend.

The candidates, most specific first: the strategies installed packages declare in the entry-point
group ``debug_framework.drill_strategies`` (:mod:`.entry_points`; e.g. ``debug_module``'s Inductor
one, which needs its minifier); then the strategy each registered engine names in its record
(:func:`debug_framework.backends.registry.drill_strategy_factories`: an engine's strategy lives in
its package); then the generic strategies of :data:`STRATEGY_FACTORIES` (trace, replay). The stage
asks each (a new instance per validation run) whether it
:meth:`~debug_framework.backends.drilldown.types.DrillStrategy.applies` to the alternative backend
and uses the first that does. An engine adds its strategy in its registry record; a generic
strategy is one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...backends.drilldown.types import DrillStrategy
from ...backends.registry import drill_strategy_factories

if TYPE_CHECKING:
    from ...backends.base import Backend

__all__ = ["STRATEGY_FACTORIES", "choose_strategy"]


def _replay() -> DrillStrategy:
    from .replay import ReplayStrategy

    return ReplayStrategy()


def _trace() -> DrillStrategy:
    from .trace import TraceStrategy

    return TraceStrategy()


#: The generic strategies, asked after the engines' own (a factory imports its module lazily: torch
#: only when used).
STRATEGY_FACTORIES: list[Callable[[], DrillStrategy]] = [
    _trace,
    _replay,
]


def choose_strategy(backend: Backend, factories: list[Callable[[], DrillStrategy]] | None = None
                    ) -> tuple[DrillStrategy | None, str]:
    """``(strategy, "")``: the first strategy that applies to ``backend``; ``(None, why)`` with every
    strategy's reason when none does. ``factories``: ask these only."""
    reasons: list[str] = []
    if factories is None:
        from .entry_points import entry_point_strategies

        installed, failures = entry_point_strategies()
        reasons += [str(f) for f in failures]
        candidates = [*(lambda s=s: s for s in installed), *drill_strategy_factories(), *STRATEGY_FACTORIES]
    else:
        candidates = list(factories)
    for factory in candidates:
        strategy = factory()
        ok, why = strategy.applies(backend)
        if ok:
            return strategy, ""
        reasons.append(f"{strategy.name}: {why}")
    return None, "no drill-down strategy applies to this backend (" + ("; ".join(reasons) or "none registered") + ")"
