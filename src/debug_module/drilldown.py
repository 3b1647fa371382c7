"""The Inductor drill-down strategy's entry point (``debug_framework.drill_strategies``:
``inductor = "debug_module.drilldown:InductorDrillStrategy"``), light on purpose: every drill-down
loads the installed strategies to ask which applies, and a session that never touches torch (an
ONNX file's) must not import it for that. The strategy's work, and torch, live in
:mod:`debug_module.drilldown_inductor` (the module docstring there says how it drills), imported
when a layer is drilled; its other public names are read from there on first use.
"""

from __future__ import annotations

from debug_framework.services.drilldown.support import BackendStrategy
from debug_framework.services.drilldown.types import DrillRequest, LayerDrilldown

__all__ = ["InductorDrillStrategy"]  # the others (capture_layer_graph...): module __getattr__


class InductorDrillStrategy(BackendStrategy):
    """Drill layers of the ``inductor`` backend with the minifier
    (:class:`debug_module.drilldown_inductor.InductorDrillStrategy`, imported on :meth:`drill`).

    ``max_seconds``: the minifier's time budget per layer."""

    name = "minifier"
    backend_name, method, label = "inductor", "layer_call", "Inductor"

    def __init__(self, max_seconds: float = 600.0) -> None:
        self.max_seconds = max_seconds

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        from .drilldown_inductor import InductorDrillStrategy as Minifying

        return Minifying(self.max_seconds).drill(request)


def __getattr__(name: str) -> object:
    """The Inductor drill-down's other names (``capture_layer_graph``, ``layer_signature``...), read
    from :mod:`debug_module.drilldown_inductor` on first use (it imports torch)."""
    if name.startswith("__"):
        raise AttributeError(name)
    from . import drilldown_inductor

    try:
        return getattr(drilldown_inductor, name)
    except AttributeError:
        raise AttributeError(f"module 'debug_module.drilldown' has no attribute {name!r}") from None
