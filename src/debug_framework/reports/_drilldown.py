"""The ``drilldown`` section of the HTML report: per drilled layer, the culprit and the operator table.

Reads the typed drill-down (:class:`~debug_framework.services.drilldown.types.LayerDrilldown`, one
per drilled layer, as :meth:`ValidationResult.load` reads them back); every value is escaped.
Absent (an empty string) when the session did not ask for a drill-down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..services.drilldown.types import Culprit, LayerDrilldown, OperatorRow, drilled_where
from ._common import fmt_num
from ._html import esc

__all__ = ["drilldown_section", "drilldown_culprits"]

_COLUMNS = ("#", "op", "module path", "source", "introduced", "carried in", "bound", "margin")


def _figure(value: float) -> str:
    """An operator's figure; unmeasured (NaN) as blank, as its JSON stores it (null)."""
    return "" if math.isnan(value) else fmt_num(value)


def _row(r: OperatorRow, culprit: str | None) -> str:
    cls = "first" if r.node == culprit else ("fail" if r.introduces else "")
    margin = r.margin
    cells = [esc(r.index), f"<code>{esc(r.op)}</code>", esc(r.module_path or "-"),
             esc(r.source or "-"), esc(_figure(r.introduced)), esc(_figure(r.carried_in)),
             esc(_figure(r.bound)), esc("-" if math.isnan(margin) else f"{margin:.3g}")]
    return f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _culprit(entry: LayerDrilldown) -> str:
    c = entry.culprit
    if c is None:
        return f'<p class="muted">no culprit operator: {esc(entry.note)}</p>'
    repro_html = "" if not c.repro_dir else (f"; repro <code>{esc(c.repro_dir)}</code> "
                                             f"({'verified: it fails while the bug is there' if c.verified else 'not verified'})")
    return (f'<p class="culprit">culprit: <strong><code>{esc(c.op)}</code></strong> at '
            f"<code>{esc(c.module_path or '?')}</code> ({esc(c.source or '?')}){repro_html}</p>"
            + (f'<p class="note">{esc(entry.note)}</p>' if entry.note else ""))


#: Operators on each side of the culprit (graph order) shown with it; the rest are folded.
NEIGHBOURS = 3
#: A layer with at most this many operators is shown whole (nothing worth folding).
UNFOLDED = 12


def _table(rows: Sequence[OperatorRow], culprit: str | None) -> str:
    return ('<div class="scroll"><table class="drilldown"><tr>' + "".join(f"<th>{esc(c)}</th>" for c in _COLUMNS)
            + "</tr>" + "".join(_row(r, culprit) for r in rows) + "</table></div>")


def _split(rows: Sequence[OperatorRow], culprit: str | None) -> tuple[list[OperatorRow], list[OperatorRow]]:
    """(shown, folded): the culprit first, then its neighbourhood (``NEIGHBOURS`` operators either
    side in graph order) and every other operator that introduces error; the rest folded."""
    ordered = sorted(rows, key=lambda r: r.index)
    if len(ordered) <= UNFOLDED:
        return sorted(ordered, key=lambda r: culprit is None or r.node != culprit), []
    at = next((n for n, r in enumerate(ordered) if r.node == culprit), None)
    near = set() if at is None else set(range(at - NEIGHBOURS, at + NEIGHBOURS + 1))
    keep = [r for n, r in enumerate(ordered) if n in near or r.introduces]
    if not keep:  # no culprit and nothing introduces: the first operators, the rest folded
        keep = ordered[:UNFOLDED]
    kept = {id(r) for r in keep}
    shown = sorted(keep, key=lambda r: culprit is None or r.node != culprit)
    return shown, [r for r in ordered if id(r) not in kept]


def _layer(entry: LayerDrilldown) -> str:
    culprit = None if entry.culprit is None else entry.culprit.node
    head = (f"<h3>{esc(drilled_where(entry.layer, entry.step))} ({esc(entry.checkpoint)}): "
            f"{esc(entry.backend)}, method {esc(entry.method)}</h3>")
    shown, folded = _split(entry.operators, culprit)
    table = "" if not shown else _table(shown, culprit)
    if shown and culprit:
        table += ('<p class="muted">the culprit first, then its neighbours and every operator that introduces '
                  "error, in graph order (#)</p>" if folded else
                  '<p class="muted">the culprit first, then every operator in graph order (#)</p>')
    if folded:
        within = all(not r.introduces for r in folded)
        table += (f'<details class="more-operators"><summary>{len(folded)} more operators'
                  f"{', all within their bounds' if within else ''}</summary>{_table(folded, culprit)}</details>")
    return f'<div class="drilled-layer">{head}{_culprit(entry)}{table}</div>'


def drilldown_section(entries: Sequence[LayerDrilldown] | None) -> str:
    """The section, or "" when the session has no drill-down (``entries`` None)."""
    if entries is None:
        return ""
    body = "".join(_layer(e) for e in entries) or '<p class="muted">nothing to drill: no layer diverges</p>'
    intro = ('<p class="muted">Each operator of the layer replayed alone on the reference\'s input to it, against a '
             "float64 run of a correct implementation: introduced error (RMS), the error its inputs carry in, "
             "and its calibrated bound.</p>")
    return f'<section id="drilldown"><h2>Drill-down: the operator that introduces the error</h2>{intro}{body}</section>'


def _culprit_text(c: Culprit | None) -> str:
    return "none" if c is None else f"{c.op} at {c.module_path or '?'} ({c.source or '?'})"


def drilldown_culprits(entries: Sequence[LayerDrilldown] | None) -> str | None:
    """``"layer 1: aten.gelu.default at encoder.layer.1... (activations.py:51); layer 3: none"``: one
    line for JUnit properties and messages; None when the session has no drill-down."""
    if entries is None:
        return None
    parts = [f"{drilled_where(e.layer, e.step)}: {_culprit_text(e.culprit)}" for e in entries]
    return "; ".join(parts) or "nothing drilled"
