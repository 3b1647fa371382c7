"""Which drill-down strategy sees inside which backend.

:data:`STRATEGY_FACTORIES` lists the built-in strategies in order of preference; strategies that
installed packages declare in the entry-point group ``debug_framework.drill_strategies``
(:mod:`.entry_points`; e.g. ``debug_module``'s Inductor strategy, which needs its minifier) come
before them, being more specific. The stage asks each (a new instance per validation run) whether it
:meth:`~.types.DrillStrategy.applies` to the alternative backend and uses the first that does.
Adding a built-in strategy is one line: append its factory here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .types import DrillStrategy

__all__ = ["STRATEGY_FACTORIES", "choose_strategy"]


def _replay() -> DrillStrategy:
    from .replay import ReplayStrategy

    return ReplayStrategy()


def _onnx() -> DrillStrategy:
    from .onnx import OnnxDrillStrategy

    return OnnxDrillStrategy()


def _trace() -> DrillStrategy:
    from .trace import TraceStrategy

    return TraceStrategy()


def _openvino() -> DrillStrategy:
    from .openvino import OpenVinoDrillStrategy

    return OpenVinoDrillStrategy()


#: Strategy factories, most specific first (a factory imports its module lazily: torch only when used).
STRATEGY_FACTORIES: list[Callable[[], DrillStrategy]] = [
    _onnx,
    _openvino,
    _trace,
    _replay,
]


def choose_strategy(backend: Any, factories: list[Callable[[], DrillStrategy]] | None = None
                    ) -> tuple[DrillStrategy | None, str]:
    """``(strategy, "")``: the first strategy that applies to ``backend``; ``(None, why)`` with every
    strategy's reason when none does."""
    reasons: list[str] = []
    if factories is None:
        from .entry_points import entry_point_strategies

        installed, failures = entry_point_strategies()
        reasons += [str(f) for f in failures]
        candidates = [*(lambda s=s: s for s in installed), *STRATEGY_FACTORIES]
    else:
        candidates = list(factories)
    for factory in candidates:
        strategy = factory()
        ok, why = strategy.applies(backend)
        if ok:
            return strategy, ""
        reasons.append(f"{strategy.name}: {why}")
    return None, "no drill-down strategy applies to this backend (" + ("; ".join(reasons) or "none registered") + ")"
