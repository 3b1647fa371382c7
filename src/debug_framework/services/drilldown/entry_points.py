"""Drill-down strategies that installed packages add, through an entry-point group.

``debug_framework`` never imports ``debug_module`` (nor any other package built on it), yet some
strategies live there: the Inductor one needs ``debug_module``'s minifier. A package declares each
strategy in :data:`ENTRY_POINT_GROUP`, naming a class (or any factory) called with no arguments::

    [project.entry-points."debug_framework.drill_strategies"]
    inductor = "debug_module.drilldown:InductorDrillStrategy"

and the drill-down stage asks :func:`entry_point_strategies` for them, after its built-in ones
or before them, as it orders its registry. A declared strategy that cannot be loaded never stops a
drill-down: it is left out and said why in the second list.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...backends.drilldown.types import DrillStrategy

__all__ = ["ENTRY_POINT_GROUP", "StrategyLoadFailure", "entry_point_strategies"]

#: The entry-point group of installed drill-down strategies: ``name = "package.module:Factory"``.
ENTRY_POINT_GROUP = "debug_framework.drill_strategies"


@dataclass(frozen=True)
class StrategyLoadFailure:
    """A declared strategy that was left out: its entry-point name, its target and why."""

    name: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"drill-down strategy {self.name!r} ({self.target}) was not loaded: {self.reason}"


def _is_strategy(obj: object) -> bool:
    """Whether ``obj`` has what :class:`DrillStrategy` asks for: a ``name``, ``applies`` and ``drill``."""
    return isinstance(getattr(obj, "name", None), str) and callable(getattr(obj, "applies", None)) \
        and callable(getattr(obj, "drill", None))


def entry_point_strategies(group: str = ENTRY_POINT_GROUP) -> tuple[list[DrillStrategy], list[StrategyLoadFailure]]:
    """The strategies installed packages declare in ``group`` (one instance each, in the order the
    entry points are found, one per name), and the ones that could not be loaded: an import
    error, a factory that raised, or an object without ``name``/``applies``/``drill``."""
    from importlib.metadata import entry_points

    strategies: list[DrillStrategy] = []
    failures: list[StrategyLoadFailure] = []
    seen: set[str] = set()
    for ep in entry_points(group=group):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            made = ep.load()()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal
            failures.append(StrategyLoadFailure(ep.name, ep.value, f"{type(exc).__name__}: {exc}"))
            continue
        if not _is_strategy(made):
            failures.append(StrategyLoadFailure(ep.name, ep.value, "it has no name, applies() and drill()"))
            continue
        strategies.append(made)
    return strategies, failures
