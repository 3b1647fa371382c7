"""CSV report: one row per ``(checkpoint, layer)`` in model order, every metric a column.

Columns: ``session_id, index, id, checkpoint, layer, passed, first_divergence``, the judgement
(``judged_by``, ``judged_metric``, ``judged_error``: the figure held to ``bound``, ``margin`` =
judged_error / bound, ``detectable_change``: the smallest relative change of the output the bound
would catch) then the metric columns, ``introduced_error, propagated_error, reason, tolerance`` (JSON); ``id`` is the
checkpoint's canonical id (``post_attention:1``). The diff's columns start ``id, checkpoint, layer,
change``. Non-finite numbers are written ``nan``/``inf``/``-inf``. Text cells that a spreadsheet
would run as a formula (leading ``= + - @``, tab or CR, unless the cell is a number) get a leading
apostrophe.
"""

from __future__ import annotations

import csv
import io
from ..jsonio import dumps_json
from ._common import METRICS, fmt_num
from .documents import DiffSource, ReportSource, stored

__all__ = ["CSV_COLUMNS", "render_csv", "render_diff_csv"]

CSV_COLUMNS = ("session_id", "index", "id", "checkpoint", "layer", "passed", "first_divergence", "judged_by",
               "judged_metric", "judged_error", "bound", "margin", "detectable_change", *METRICS,
               "introduced_error", "propagated_error", "reason", "tolerance")


def _safe_text(value: object) -> str:
    text = "" if value is None else str(value)
    if text and text[0] in "=+-@\t\r":
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def _num(value: object) -> str:
    return fmt_num(value, style="machine", text=_safe_text)


def render_csv(report: ReportSource) -> str:
    """One row per checkpoint of the stored session, in model order (:data:`CSV_COLUMNS`)."""
    view = stored(report)
    first = view.first_divergence
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for i, r in enumerate(view.rows):
        p = r.state
        tol = None if r.tolerance is None else r.tolerance.to_dict()
        w.writerow([
            _safe_text(view.record.session_id), i, _safe_text(r.id), _safe_text(r.key.name),
            "" if r.key.layer is None else r.key.layer,
            "" if p is None else int(p), int(r is first), _safe_text(r.judged_by if r.judged else None),
            _safe_text(r.judged_metric), _num(r.judged_error), _num(r.bound), _num(r.margin), _num(r.detectable_change),
            *(_num(getattr(r.comparison, m)) for m in METRICS),
            _num(r.introduced_error), _num(r.propagated_error), _safe_text(r.reason),
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
