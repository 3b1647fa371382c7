"""CSV report: one row per ``(checkpoint, layer)`` in model order, every metric a column.

Columns: ``session_id, index, id, checkpoint, layer, passed, first_divergence`` then the metric
columns, ``introduced_error, propagated_error, reason, tolerance`` (JSON); ``id`` is the
checkpoint's canonical id (``post_attention:1``). The diff's columns start ``id, checkpoint, layer,
change``. Non-finite numbers are written ``nan``/``inf``/``-inf``. Text cells that a spreadsheet
would run as a formula (leading ``= + - @``, tab or CR, unless the cell is a number) get a leading
apostrophe.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from ..jsonio import dumps_json
from ._common import METRICS, first_divergence_key, fmt_num, passed_state, row_id, row_key, row_place, session_results
from .documents import DiffSource, ReportSource

__all__ = ["CSV_COLUMNS", "render_csv", "render_diff_csv"]

CSV_COLUMNS = ("session_id", "index", "id", "checkpoint", "layer", "passed", "first_divergence", *METRICS,
               "introduced_error", "propagated_error", "reason", "tolerance")


def _safe_text(value: Any) -> str:
    text = "" if value is None else str(value)
    if text and text[0] in "=+-@\t\r":
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def _num(value: Any) -> str:
    return fmt_num(value, style="machine", text=_safe_text)


def render_csv(report: ReportSource) -> str:
    rows = report.checkpoint_results
    first = first_divergence_key(rows, session_results(report.session))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for i, r in enumerate(rows):
        key = row_key(r)
        p = passed_state(r)
        tol = r.get("tolerance")
        w.writerow([
            _safe_text(report.session_id), i, _safe_text(row_id(r)), _safe_text(key[0]), "" if key[1] is None else key[1],
            "" if p is None else int(p), int(first is not None and row_place(r) == first),
            *(_num(r.get(m)) for m in METRICS),
            _num(r.get("introduced_error")), _num(r.get("propagated_error")), _safe_text(r.get("reason")),
            "" if tol is None else _safe_text(dumps_json(tol, indent=None)),
        ])
    return buf.getvalue()


def render_diff_csv(diff: DiffSource) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("id", "checkpoint", "layer", "change", "before_passed", "after_passed", "before_max_abs_error",
                "after_max_abs_error"))
    for c in diff.changes:
        w.writerow((_safe_text(c.id), _safe_text(c.checkpoint), "" if c.layer is None else c.layer, c.change,
                    "" if c.before_passed is None else int(c.before_passed),
                    "" if c.after_passed is None else int(c.after_passed),
                    _num(c.before_max_abs_error), _num(c.after_max_abs_error)))
    return buf.getvalue()
