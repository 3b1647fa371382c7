"""The session page's figures, drawn from the numbers the reports compute (never re-derived here):
per-checkpoint error curves with the bound each checkpoint was judged by, and the error heatmap."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import altair as alt
import pandas as pd

from ..jsonio import JsonValue
from ..reports._common import LOG_METRICS
from ..reports._decode import Cell, decode_view, margin_text
from ..reports._html import colorize
from ..reports._tensors import heatmap_for, open_store
from ..reports.html_report import _bound_values, _metric_values
from ..services.drilldown.types import LayerDrilldown

if TYPE_CHECKING:
    import numpy as np

    from ..services.validation.results import CheckpointResult, ValidationResult

__all__ = ["CURVE_METRICS", "curve_frame", "curve_chart", "checkpoint_frame", "heatmap_image", "decode_frames"]

#: The metrics offered as curves: the reports' log-scale metrics and SQNR.
CURVE_METRICS: tuple[str, ...] = (*LOG_METRICS, "sqnr_db")
_CURVE_COLUMNS = ["order", "checkpoint", "series", "value", "status"]


def curve_frame(rows: Sequence[CheckpointResult], metric: str) -> pd.DataFrame:
    """Long form: per checkpoint (model order, by id) the metric's value and its bound in the same units."""
    labels = [r.id for r in rows]
    values, bounds = _metric_values(rows, metric), _bound_values(rows, metric)
    status = ["pass" if p else ("fail" if p is False else "n/a") for p in (r.state for r in rows)]
    out = []
    for i, (label, v, b, st) in enumerate(zip(labels, values, bounds, status)):
        out.append({"order": i, "checkpoint": label, "series": metric, "value": v, "status": st})
        out.append({"order": i, "checkpoint": label, "series": "bound", "value": b, "status": "bound"})
    frame = pd.DataFrame(out, columns=_CURVE_COLUMNS)  # the columns even without rows (no checkpoint yet)
    if frame.empty:
        return frame
    keep = frame["value"].map(lambda x: x is not None and pd.notna(x) and abs(x) != float("inf"))
    return frame[keep & ((frame["value"] > 0) | (metric == "sqnr_db"))]


def curve_chart(frame: pd.DataFrame, metric: str, first_divergence: str | None) -> alt.Chart:
    """The metric (points coloured pass/fail) and its bound (grey line), log scale for errors; a red
    rule at the first divergence."""
    order = list(dict.fromkeys(frame.sort_values("order")["checkpoint"]))
    y = alt.Y("value:Q", title=metric, scale=alt.Scale(type="linear" if metric == "sqnr_db" else "log"))
    x = alt.X("checkpoint:N", sort=order, title="checkpoint (model order)")
    data = frame[frame["series"] == metric]
    line = alt.Chart(data).mark_line(color="#2b6cb0").encode(x=x, y=y)
    points = alt.Chart(data).mark_point(filled=True, size=50).encode(
        x=x, y=y, color=alt.Color("status:N", scale=alt.Scale(domain=["pass", "fail", "n/a"],
                                                              range=["#2b6cb0", "#c53030", "#718096"])),
        tooltip=["checkpoint", "value", "status"])
    bound = alt.Chart(frame[frame["series"] == "bound"]).mark_line(color="#718096", strokeDash=[4, 3]).encode(
        x=x, y=y, tooltip=["checkpoint", alt.Tooltip("value:Q", title="bound")])
    layers = [line, points, bound]
    if first_divergence in order:
        layers.append(alt.Chart(pd.DataFrame({"checkpoint": [first_divergence]})).mark_rule(color="#c53030")
                      .encode(x=alt.X("checkpoint:N", sort=order)))
    return alt.layer(*layers).properties(height=320)


def checkpoint_frame(rows: Sequence[CheckpointResult]) -> pd.DataFrame:
    """The checkpoint table: the checkpoint's id, the verdict, what judged it, its margin (judged /
    bound), ``judged`` (the error in the metric the rule held to the bound), the bound, ``sees`` (the
    smallest relative change of the output the bound would catch, as the terminal and the HTML
    report write it), the errors."""
    from ..reports._sections import change_text

    out = []
    for r in rows:
        c = r.comparison
        out.append({"checkpoint": r.id, "passed": r.state, "judged by": r.judged_by if r.judged else None,
                    "margin": r.margin, "judged": r.judged_error, "bound": r.bound,
                    "sees": change_text(r.detectable_change), "rmse": c.rmse, "max_abs_error": c.max_abs_error,
                    "rel_l2_error": c.rel_l2_error, "sqnr_db": c.sqnr_db, "introduced": r.introduced_error,
                    "carried in": r.propagated_error, "reason": r.reason})
    return pd.DataFrame(out)


def heatmap_image(row: CheckpointResult, recordings: Sequence[Mapping[str, JsonValue]],
                  store_root: str | None) -> tuple[np.ndarray, str, list[str]] | None:
    """``(RGB pixels, source, notes)`` of the row's error heatmap (recorded tensors, else the
    worst-element list), or None when there is nothing to draw."""
    hm = heatmap_for(row, recordings, open_store(None, store_root))
    if hm is None:
        return None
    rgb, _, _ = colorize(hm.matrix)
    return rgb, hm.source, list(hm.notes)


def _figure(value: float) -> float | None:
    """An operator's figure: NaN (unmeasured) as None, as its JSON stores it."""
    return None if math.isnan(value) else value


def drilldown_frame(entry: LayerDrilldown) -> pd.DataFrame:
    """One drilled layer's operator table: the culprit first (marked), then graph order (``#``): op,
    module path, source, introduced, carried in, bound, margin, and whether it introduces error."""
    columns = ["#", "culprit", "node", "op", "module_path", "source", "introduced", "carried_in", "bound", "margin",
               "introduces"]
    culprit = None if entry.culprit is None else entry.culprit.node
    rows = [{"#": r.index, "culprit": r.node == culprit, "node": r.node, "op": r.op, "module_path": r.module_path,
             "source": r.source, "introduced": _figure(r.introduced), "carried_in": _figure(r.carried_in),
             "bound": _figure(r.bound), "margin": _figure(r.margin), "introduces": r.introduces}
            for r in entry.operators]
    rows.sort(key=lambda row: not row["culprit"])
    return pd.DataFrame(rows, columns=columns)


def decode_frames(result: ValidationResult) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """A decoded session's step x layer margins (the reports' :func:`~debug_framework.reports._decode.decode_view`,
    with the tokens' figures per step) and its KV cache's margins by step and layer; None without
    decode steps. A failing cell reads ``2.8e5 FAIL``."""
    view = decode_view(result)
    if view is None:
        return None

    def text(cell: Cell | None) -> str:
        if cell is None:
            return ""
        flag = " FIRST" if cell.first else (" FAIL" if cell.passed is False else "")
        return margin_text(cell.margin, cell.passed) + flag

    grid = []
    for s in view.steps:
        t = view.tokens.get(s)
        grid.append({"step": s, **{c: text(view.margins.get(s, {}).get(c)) for c in view.columns},
                     "KL mean": None if t is None else t.kl_mean, "top-1": None if t is None else t.top1_agreement,
                     "top-k": None if t is None else t.topk_overlap,
                     "tokens": "" if t is None or t.passed is None else ("pass" if t.passed else "FAIL")})
    kv = pd.DataFrame([{"step": s, **{str(i): text(view.kv[s].get(i)) for i in view.kv_layers}}
                       for s in sorted(view.kv)])
    return pd.DataFrame(grid), kv
