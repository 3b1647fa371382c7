"""The drill-down in the terminal: per drilled layer, the operator table and the culprit line.

Reads the result's JSON view (``result["drilldown"]``: :meth:`LayerDrilldown.to_dict` entries), so
``debug_validate`` and ``session_report`` print the same thing. Every value is literal text.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .framework import add_row, markup

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["print_drilldown", "operator_table", "culprit_line", "MAX_ROWS"]

#: Operator rows shown per layer without --verbose: the introducing ones, the culprit's
#: neighbours, and the largest margins.
MAX_ROWS = 12


def _num(v: Any) -> str:
    if isinstance(v, str):  # JSON's non-finite spellings
        return v.lower()
    if not isinstance(v, (int, float)) or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.2e}"


def _margin(v: Any) -> str:
    if isinstance(v, str):
        return v.lower()
    return "-" if not isinstance(v, (int, float)) or math.isnan(v) else f"{v:.3g}"


def _sort_key(row: dict[str, Any]) -> float:
    m = row.get("margin")
    if isinstance(m, str):
        return math.inf if m.lower().startswith("inf") else -1.0
    return -1.0 if m is None else float(m)


def _shown(rows: list[dict[str, Any]], verbose: bool) -> list[dict[str, Any]]:
    if verbose or len(rows) <= MAX_ROWS:
        return rows
    keep = {r["index"] for r in rows if r.get("introduces")}
    keep |= {r["index"] for r in sorted(rows, key=_sort_key, reverse=True)[:MAX_ROWS]}
    return [r for r in rows if r["index"] in keep][: max(MAX_ROWS, len(keep))]


def operator_table(entry: dict[str, Any], verbose: bool = False) -> Table:
    """One drilled layer's operators in graph order (the culprit highlighted)."""
    from rich.table import Table

    rows = entry.get("operators") or []
    culprit = (entry.get("culprit") or {}).get("node")
    t = Table(title=markup("layer {} ({}): operators of {} replayed alone on the reference's input ({})",
                           entry.get("layer"), entry.get("checkpoint"), entry.get("backend"), entry.get("method")))
    for col, justify in (("#", "right"), ("op", "left"), ("module path", "left"), ("source", "left"),
                         ("introduced", "right"), ("carried in", "right"), ("bound", "right"), ("margin", "right")):
        t.add_column(col, justify=justify, no_wrap=col != "module path")  # type: ignore[arg-type]
    shown = _shown(rows, verbose)
    for r in shown:
        style = "bold white on red" if r.get("node") == culprit else ("red" if r.get("introduces") else None)
        add_row(t, r.get("index"), r.get("op"), r.get("module_path") or "-", r.get("source") or "-",
                _num(r.get("introduced")), _num(r.get("carried_in")), _num(r.get("bound")), _margin(r.get("margin")),
                style=style)
    if len(shown) < len(rows):
        t.caption = f"{len(rows) - len(shown)} operators within their bounds not shown (--verbose shows all)"
    return t


def culprit_line(entry: dict[str, Any]) -> str:
    """``culprit: aten.gelu.default at encoder.layer.1... (activations.py:51); repro ... (verified)``."""
    c = entry.get("culprit")
    if not c:
        return markup("layer {}: no culprit operator: {}", entry.get("layer"), entry.get("note") or "")
    repro = c.get("repro_dir")
    tail = "" if not repro else markup("; repro {} ({})", repro, "verified" if c.get("verified") else "not verified")
    return markup("layer {}: culprit [bold]{}[/] at {} ({})", entry.get("layer"), c.get("op"),
                  c.get("module_path") or "?", c.get("source") or "?") + tail


def print_drilldown(out: Console, result: dict[str, Any], verbose: bool = False) -> None:
    """The drill-down part of a result (nothing when it was not requested)."""
    entries = result.get("drilldown")
    if entries is None:
        return
    if not entries:
        out.print("drill-down: nothing to drill (no layer diverges)")
        return
    for entry in entries:
        if entry.get("operators"):
            out.print(operator_table(entry, verbose))
        out.print(culprit_line(entry))
        if entry.get("culprit") and entry.get("note"):
            out.print(markup("  note: {}", entry["note"]))
