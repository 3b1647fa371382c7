"""The drill-down in the terminal: per drilled layer, the operator table and the culprit line.

Reads the result's JSON view (``result["drilldown"]``: :meth:`LayerDrilldown.to_dict` entries), so
``debug_validate`` and ``session_report`` print the same thing. Every value is literal text.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..services.drilldown.types import drilled_where
from .framework import markup

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


def _shown(rows: list[dict[str, Any]], culprit: str | None, verbose: bool) -> list[dict[str, Any]]:
    """The rows to print: all with ``verbose``, else the culprit, every operator that introduces error
    and the largest margins (at least :data:`MAX_ROWS` in all); the culprit first, then graph order."""
    if verbose or len(rows) <= MAX_ROWS:
        keep = {r["index"] for r in rows}
    else:
        keep = {r["index"] for r in rows if r.get("introduces") or r.get("node") == culprit}
        for r in sorted(rows, key=_sort_key, reverse=True):
            if len(keep) >= MAX_ROWS:
                break
            keep.add(r["index"])
    shown = [r for r in rows if r["index"] in keep]
    return sorted(shown, key=lambda r: r.get("node") != culprit or culprit is None)


def operator_table(entry: dict[str, Any], verbose: bool = False, width: int = 120) -> Table:
    """One drilled layer's operators, the culprit first and highlighted, fitted to ``width`` columns."""
    from .tables import Column, common_prefix, fitted_table, short_op

    rows = entry.get("operators") or []
    culprit = (entry.get("culprit") or {}).get("node")
    shown = _shown(rows, culprit, verbose)
    prefix = common_prefix([str(r.get("module_path") or "") for r in shown])
    columns = (Column("#", number=True),
               Column("op", min_width=14, short=short_op, short_note="op names without aten. and .default"),
               Column("module path", min_width=12, keep=2,
                      short=lambda p: p[len(prefix):] if prefix and p.startswith(prefix) else p,
                      short_note=f"module paths under {prefix[:-1]}" if prefix else None),
               Column("source", min_width=16, keep=3), Column("introduced", number=True),
               Column("carried in", number=True, keep=1), Column("bound", number=True, keep=4),
               Column("margin", number=True))
    cells = [[str(r.get("index")), str(r.get("op")), str(r.get("module_path") or "-"), str(r.get("source") or "-"),
              _num(r.get("introduced")), _num(r.get("carried_in")), _num(r.get("bound")), _margin(r.get("margin"))]
             for r in shown]
    styles = ["bold white on red" if r.get("node") == culprit else ("red" if r.get("introduces") else None)
              for r in shown]
    notes = []
    if culprit is not None and shown and shown[0].get("node") == culprit:
        notes.append("the culprit first")
    if len(shown) < len(rows):
        notes.append(f"{len(rows) - len(shown)} more operators, all within their bounds and with smaller "
                     "margins than those shown, not shown (--verbose shows all)")
    title = (f"{drilled_where(entry.get('layer'), entry.get('step'))} ({entry.get('checkpoint')}): operators of "
             f"{entry.get('backend')} "
             f"replayed alone on the reference's input ({entry.get('method')})")
    return fitted_table(title, columns, cells, width, styles=styles, caption="; ".join(notes) or None)


def culprit_line(entry: dict[str, Any]) -> str:
    """``culprit: aten.gelu.default at encoder.layer.1... (activations.py:51); repro ... (verified)``."""
    c = entry.get("culprit")
    if not c:
        return markup("{}: no culprit operator: {}", drilled_where(entry.get("layer"), entry.get("step")),
                      entry.get("note") or "")
    repro = c.get("repro_dir")
    tail = "" if not repro else markup("; repro {} ({})", repro, "verified" if c.get("verified") else "not verified")
    return markup("{}: culprit [bold]{}[/] at {} ({})", drilled_where(entry.get("layer"), entry.get("step")),
                  c.get("op"), c.get("module_path") or "?", c.get("source") or "?") + tail


def print_drilldown(out: Console, result: dict[str, Any], verbose: bool = False) -> None:
    """The drill-down part of a result (nothing when it was not requested)."""
    entries = result.get("drilldown")
    if entries is None:
        return
    if not entries:
        out.print("drill-down: nothing to drill (no layer diverges)")
        return
    for entry in entries:
        out.print(culprit_line(entry))  # the answer first, then the evidence
        if entry.get("operators"):
            out.print(operator_table(entry, verbose, out.width))
        if entry.get("culprit") and entry.get("note"):
            out.print(markup("  note: {}", entry["note"]))
