"""Which drill-down strategy sees inside which backend.

:data:`STRATEGY_FACTORIES` lists the strategies in order of preference; the stage asks each (a new
instance per validation run) whether it :meth:`~.types.DrillStrategy.applies` to the alternative
backend and uses the first that does. Adding a strategy is one line: append its factory here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .types import DrillStrategy

__all__ = ["STRATEGY_FACTORIES", "choose_strategy"]


def _replay() -> DrillStrategy:
    from .replay import ReplayStrategy

    return ReplayStrategy()


#: Strategy factories, most specific first (a factory imports its module lazily: torch only when used).
STRATEGY_FACTORIES: list[Callable[[], DrillStrategy]] = [
    _replay,
]


def choose_strategy(backend: Any, factories: list[Callable[[], DrillStrategy]] | None = None
                    ) -> tuple[DrillStrategy | None, str]:
    """``(strategy, "")``: the first strategy that applies to ``backend``; ``(None, why)`` with every
    strategy's reason when none does."""
    reasons = []
    for factory in STRATEGY_FACTORIES if factories is None else factories:
        strategy = factory()
        ok, why = strategy.applies(backend)
        if ok:
            return strategy, ""
        reasons.append(f"{strategy.name}: {why}")
    return None, "no drill-down strategy applies to this backend (" + ("; ".join(reasons) or "none registered") + ")"
