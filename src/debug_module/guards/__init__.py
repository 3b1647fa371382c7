"""Dynamo guard, graph-break and recompilation inspection."""

from .inspector import GraphBreak, GraphInfo, GuardInspector, GuardReport, GuardSet, Recompilation

__all__ = ["GuardInspector", "GuardReport", "GraphInfo", "GraphBreak", "GuardSet", "Recompilation"]
