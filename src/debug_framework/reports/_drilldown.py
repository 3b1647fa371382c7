"""The ``drilldown`` section of the HTML report: per drilled layer, the culprit and the operator table.

Reads the session summary's ``drilldown`` entries (:meth:`LayerDrilldown.to_dict`); every value is
escaped. Absent (an empty string) when the session did not ask for a drill-down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..services.drilldown.types import drilled_where
from ._common import as_float, fmt_num
from ._html import esc

__all__ = ["drilldown_section", "drilldown_culprits"]

_COLUMNS = ("#", "op", "module path", "source", "introduced", "carried in", "bound", "margin")


def _row(r: Mapping[str, Any], culprit: str | None) -> str:
    cls = "first" if r.get("node") == culprit else ("fail" if r.get("introduces") else "")
    margin = as_float(r.get("margin"))
    cells = [esc(r.get("index")), f"<code>{esc(r.get('op'))}</code>", esc(r.get("module_path") or "-"),
             esc(r.get("source") or "-"), esc(fmt_num(r.get("introduced"))), esc(fmt_num(r.get("carried_in"))),
             esc(fmt_num(r.get("bound"))), esc("-" if margin is None else f"{margin:.3g}")]
    return f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _culprit(entry: Mapping[str, Any]) -> str:
    c = entry.get("culprit")
    if not isinstance(c, Mapping):
        return f'<p class="muted">no culprit operator: {esc(entry.get("note") or "")}</p>'
    repro = c.get("repro_dir")
    repro_html = "" if not repro else (f"; repro <code>{esc(repro)}</code> "
                                       f"({'verified: it fails while the bug is there' if c.get('verified') else 'not verified'})")
    return (f'<p class="culprit">culprit: <strong><code>{esc(c.get("op"))}</code></strong> at '
            f"<code>{esc(c.get('module_path') or '?')}</code> ({esc(c.get('source') or '?')}){repro_html}</p>"
            + (f'<p class="note">{esc(entry.get("note"))}</p>' if entry.get("note") else ""))


def _layer(entry: Mapping[str, Any]) -> str:
    rows = [r for r in entry.get("operators") or [] if isinstance(r, Mapping)]
    culprit = (entry.get("culprit") or {}).get("node") if isinstance(entry.get("culprit"), Mapping) else None
    head = (f"<h3>{esc(drilled_where(entry.get('layer'), entry.get('step')))} ({esc(entry.get('checkpoint'))}): "
            f"{esc(entry.get('backend'))}, "
            f"method {esc(entry.get('method'))}</h3>")
    rows = sorted(rows, key=lambda r: culprit is None or r.get("node") != culprit)  # the culprit first
    table = "" if not rows else (
        '<div class="scroll"><table class="drilldown"><tr>' + "".join(f"<th>{esc(c)}</th>" for c in _COLUMNS)
        + "</tr>" + "".join(_row(r, culprit) for r in rows) + "</table></div>"
        + ('<p class="muted">the culprit first, then every operator in graph order (#)</p>' if culprit else ""))
    return f'<div class="drilled-layer">{head}{_culprit(entry)}{table}</div>'


def drilldown_section(results: Mapping[str, Any]) -> str:
    """The section, or "" when the session has no drill-down."""
    entries = results.get("drilldown")
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        return ""
    body = "".join(_layer(e) for e in entries if isinstance(e, Mapping)) or \
        '<p class="muted">nothing to drill: no layer diverges</p>'
    intro = ('<p class="muted">Each operator of the layer replayed alone on the reference\'s input to it, against a '
             "float64 run of a correct implementation: introduced error (RMS), the error its inputs carry in, "
             "and its calibrated bound.</p>")
    return f'<section id="drilldown"><h2>Drill-down: the operator that introduces the error</h2>{intro}{body}</section>'


def drilldown_culprits(results: Mapping[str, Any]) -> str | None:
    """``"layer 1: aten.gelu.default at encoder.layer.1... (activations.py:51); layer 3: none"``: one
    line for JUnit properties and messages; None when the session has no drill-down."""
    entries = results.get("drilldown")
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        return None
    parts = []
    for e in entries:
        if not isinstance(e, Mapping):
            continue
        c = e.get("culprit")
        parts.append(f"{drilled_where(e.get('layer'), e.get('step'))}: " + (f"{c.get('op')} at {c.get('module_path') or '?'} "
                                                     f"({c.get('source') or '?'})" if isinstance(c, Mapping) else "none"))
    return "; ".join(parts) or "nothing drilled"
