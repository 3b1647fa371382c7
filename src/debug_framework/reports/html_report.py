"""The HTML report of a session: one self-contained file, no scripts, no network.

Sections (each a ``<section id=...>``): ``verdict``, ``summary``, ``curves`` (per-layer error on a
log scale, one inline SVG chart per metric), ``checkpoints`` (the table, first divergence marked), ``decode`` (step x layer margins, tokens, KV cache),
``isolation`` (introduced vs propagated error, when isolation ran), ``heatmap`` (worst checkpoint),
``performance``, ``tensors`` (with ``include_tensors``), ``backends``, ``tolerances``, ``config``,
``environment``, ``reproduce`` (the command), ``other-results`` (engine keys not shown above).

Everything taken from the session is escaped with :func:`~debug_framework.reports._html.esc`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..comparison import ComparisonResult
from ..jsonio import JsonValue
from ..storage.session_record import SessionRecord
from ..storage.tensor_store import TensorStore
from ._common import (
    LOG_METRICS,
    backend_label,
    error_source_text,
    introducing_text,
    precision_text,
    as_float,
    damaged_fields,
    fmt_num,
    input_sentences,
    isolation_rows,
    reproduce_command,
    verdict_of,
    worst_row,
)
from ._decode import decode_section
from ._inspector import inspector_section
from ._quantized import quantized_section
from ._drilldown import drilldown_culprits, drilldown_section
from ._html import BASE_CSS, CSP, colorbar_svg, colorize, esc, json_pre, kv_table, line_chart, lines_list, png_data_uri
from ._sections import (backends_section, change_text, metric_label, num_td, performance_section, section,
                        sensitivity_text, tolerances_section)
from ._tensors import Heatmap, heatmap_for, open_store, tensor_summary
from .documents import DiffSource, ReportSource, SessionSource, stored

if TYPE_CHECKING:
    from ..services.validation.judge import Judgement
    from ..services.validation.results import CheckpointResult, LayerResult, ValidationResult

__all__ = ["render_html", "render_diff_html"]

_TABLE_METRICS = ("max_abs_error", "mean_abs_error", "max_rel_error", "rel_l2_error", "cosine_similarity",
                  "sqnr_db", "mismatch_percent", "max_ulp_error")
_METRIC_TITLES = {
    "max_abs_error": "max |alt - ref|", "mean_abs_error": "mean |alt - ref|", "p99_abs_error": "p99 |alt - ref|",
    "rmse": "RMSE", "rel_l2_error": "relative L2 error", "max_rel_error": "max relative error",
    "max_ulp_error": "max ULP error", "mismatch_percent": "% elements over tolerance",
    "cosine_distance": "1 - cosine similarity", "sqnr_db": "SQNR (dB, higher is better)",
}
#: results keys rendered in their own sections (the rest go to "other results")
_BOUND = "#718096"  # the bound's line in every error chart
_BOUND_AFTER = "#a0aec0"  # the diff chart's: lighter than its grey "before" series
_GROWTH = ("carried_in_rmse", "carried_out_rmse", "growth", "calibration_growth")
_SHOWN_RESULT_KEYS = {"verdict", "first_divergence", "performance", "isolation", "command", "reproduce_command",
                      "repro_command", "reproduce", "recordings", "introducing_layers", "isolation_note", "oracle",
                      "noise_floor", "reference_dtype", "alternative_dtype", "checkpoints", "failed", "error_source",
                      "drilldown", "consistent_with", "decode", "inspector"}


def _metric(r: CheckpointResult, metric: str) -> float | None:
    """One metric of a checkpoint's comparison (``cosine_distance``: 1 - cosine similarity)."""
    if metric == "cosine_distance":
        c = as_float(r.comparison.cosine_similarity)
        return None if c is None else (c if math.isnan(c) else max(0.0, 1.0 - c))
    return as_float(getattr(r.comparison, metric))


def _metric_values(rows: Sequence[CheckpointResult], metric: str) -> list[float | None]:
    return [_metric(r, metric) for r in rows]


def _judged(row: CheckpointResult) -> tuple[str | None, float | None, float | None]:
    """``(metric, bound, margin)`` of the rule a row was judged by (ratio rules: their metric and
    bound; an elementwise tolerance: no metric, its margin max |a - r| / (atol + rtol |r|))."""
    rule = row.judgement.rule
    return (None if rule is None else rule.metric), row.bound, row.margin


def _bound_in_units(value: float | None, metric: str, margin: float | None) -> float | None:
    """The value ``metric`` would have at the bound (margin 1), the errors scaling together: value /
    margin for error magnitudes, + 20 log10(margin) dB for SQNR, / margin^2 for 1 - cosine."""
    if value is None or margin is None or not math.isfinite(margin) or margin <= 0 or not math.isfinite(value):
        return None
    if metric == "sqnr_db":
        return value + 20.0 * math.log10(margin)
    return value / margin**2 if metric == "cosine_distance" else value / margin


def _bound_values(rows: Sequence[CheckpointResult], metric: str) -> list[float | None]:
    """Each checkpoint's bound in the units of ``metric``'s chart: the rule's own bound where it
    judged by this metric, else the bound carried over by the margin (:func:`_bound_in_units`)."""
    values = _metric_values(rows, metric)
    out: list[float | None] = []
    for r, v in zip(rows, values):
        judged_metric, bound, margin = _judged(r)
        out.append(bound if judged_metric == metric and bound is not None else _bound_in_units(v, metric, margin))
    return out


def _verdict_class(verdict: str) -> str:
    v = verdict.lower()
    if v in {"passed", "pass", "ok"}:
        return "ok"
    if v in {"failed", "fail", "error"}:
        return "bad"
    return "other"


#: ComparisonResult figures shown in a checkpoint's details (where measured)
_DETAILS = ("numel", "reference_shape", "alternative_shape", "reference_dtype", "alternative_dtype", "median_abs_error",
            "p99_abs_error", "mean_rel_error", "rmse", "mismatch_count", "nan_count_ref", "nan_count_alt",
            "inf_count_ref", "inf_count_alt", "first_nonfinite_index")


def _details(r: CheckpointResult) -> str:
    """A checkpoint's worst elements and its other figures, folded."""
    bits = []
    if r.comparison.worst:
        wrows = "".join(f"<tr><td>{esc(list(w.index))}</td>{num_td(w.reference)}{num_td(w.alternative)}"
                        f"{num_td(w.abs_error)}</tr>" for w in r.comparison.worst)
        bits.append("<table><tr><th>index</th><th>reference</th><th>alternative</th><th>abs error</th></tr>"
                    f"{wrows}</table>")
    more: dict[str, object] = {k: getattr(r.comparison, k) for k in _DETAILS}
    more = {k: (list(v) if isinstance(v, tuple) else v) for k, v in more.items() if v not in (None, "", ())}
    if r.tolerance is not None:
        more["tolerance"] = r.tolerance.to_dict()
    if more:
        bits.append(kv_table(more))
    return f"<details><summary>details</summary>{''.join(bits)}</details>" if bits else ""


def _checkpoint_table(rows: Sequence[CheckpointResult], first: CheckpointResult | None, with_isolation: bool) -> str:
    head = ("<th>margin (error / bound)</th><th>judged</th><th>bound</th>"
            '<th title="the smallest relative change of the output the bound would catch">sees</th>'
            + "".join(f"<th>{esc(m)}</th>" for m in _TABLE_METRICS))
    iso_head = "<th>introduced</th><th>propagated</th>" if with_isolation else ""
    body = []
    for i, r in enumerate(rows):
        state = r.state
        verdict = "pass" if state is True else ("FAIL" if state is False else "?")
        is_first = r is first
        cls = "first" if is_first else ("fail" if state is False else ("unknown" if state is None else "pass"))
        mark = ' <span class="fd">&larr; first divergence</span>' if is_first else ""
        judged = metric_label(r.judged_metric) + ("" if r.judged_error is None else f" {fmt_num(r.judged_error)}")
        cells = (num_td(r.margin) + f'<td class="num judged">{esc(judged)}</td>'
                 + (f'<td class="num" title="{esc(r.judged_metric or "")}">{esc(fmt_num(r.bound))}</td>')
                 + f'<td class="num sees">{esc(change_text(r.detectable_change))}</td>'
                 + "".join(num_td(_metric(r, m)) for m in _TABLE_METRICS))
        iso = ""
        if with_isolation:
            flag = ' <strong title="this layer introduces error on its own">&#9888;</strong>' if r.introduces_error else ""
            iso = f'<td class="num">{esc(fmt_num(r.introduced_error))}{flag}</td>' + num_td(r.propagated_error)
        body.append(
            f'<tr class="{cls}" id="row-{i}"><td class="num">{i}</td><td>{esc(r.id)}</td>'
            f'<td class="num">{esc(fmt_num(r.key.layer))}</td><td>{esc(verdict)}{mark}</td>{cells}{iso}'
            f"<td class=\"reason\">{esc(r.reason)}</td><td>{_details(r)}</td></tr>")
    return (f'<div class="scroll"><table class="checkpoints"><thead><tr><th>#</th><th>checkpoint</th><th>layer</th>'
            f"<th>verdict</th>{head}{iso_head}<th>reason</th><th></th></tr></thead><tbody>{''.join(body)}</tbody>"
            "</table></div>")


def _curves(rows: Sequence[CheckpointResult], first_index: int | None) -> str:
    labels = [r.id for r in rows]
    passed = [r.state for r in rows]
    charts = []
    for m in LOG_METRICS:
        if m == "mismatch_percent":  # counts elements beyond the dtype's elementwise tolerance: in the table
            continue
        svg = line_chart(_METRIC_TITLES.get(m, m), labels, [(m, _metric_values(rows, m), "#2b6cb0"),
                                                            ("bound", _bound_values(rows, m), _BOUND)],
                         log=True, passed=passed, marker_index=first_index, chart_id=m)
        if svg:
            charts.append(svg)
    svg = line_chart(_METRIC_TITLES["sqnr_db"], labels, [("sqnr_db", _metric_values(rows, "sqnr_db"), "#2b6cb0"),
                                                         ("bound", _bound_values(rows, "sqnr_db"), _BOUND)],
                     log=False, passed=passed, marker_index=first_index, chart_id="sqnr_db", inf_is_exact=True)
    if svg:
        charts.append(svg)
    if not charts:
        return '<p class="muted">no finite error figures to plot</p>'
    legend = ('<p class="muted">x: checkpoints in model order, by id (post_attention:N and post_mlp:N are layer '
              "N's). Points: blue within the bound, red beyond it; a hollow triangle on the "
              "floor is an exact 0 (and, on the SQNR chart, a green hollow triangle just above the frame marked \u201cexact\u201d "
              "is an exact match, SQNR +inf); a magenta cross at the top is NaN/inf. Each chart names the off-scale "
              "markers it uses at its top right. The dashed red line marks the first "
              "divergence. The grey line is the bound each checkpoint was judged by: exact on the chart of the "
              "rule's own metric (RMSE by default), carried to the other charts by the margin (value / margin: "
              "where the point would sit at margin 1).</p>")
    return legend + f'<div class="charts">{"".join(charts)}</div>'


def _error(result: ComparisonResult | None) -> float | None:
    return None if result is None else as_float(result.max_abs_error)


def _layer_side(lr: LayerResult) -> tuple[Judgement, ComparisonResult]:
    """A layer's MLP-side judgement (the block ending at post_mlp) and its replay's error."""
    ev, v = lr.evidence, lr.verdict
    if v.mlp is not None:
        return v.mlp, (ev.mlp or ev.whole).error
    return v.whole, ev.whole.error


def _row_series(rows: Sequence[CheckpointResult]) -> list[tuple[float | None, float | None, float | None]]:
    """``(introduced, propagated, introduced bound)`` per checkpoint row (max abs error units)."""
    return [(r.introduced_error, r.propagated_error,
             None if r.introduced is None else _bound_in_units(r.introduced_error, "max_abs_error", r.introduced.judgement.margin))
            for r in rows]


def _layer_series(layers: Sequence[LayerResult]) -> list[tuple[float | None, float | None, float | None]]:
    """``(introduced, propagated, introduced bound)`` per isolated layer (its MLP side)."""
    out = []
    for lr in layers:
        judgement, error = _layer_side(lr)
        intro = _error(error)
        out.append((intro, _error(lr.evidence.carried_in), _bound_in_units(intro, "max_abs_error", judgement.margin)))
    return out


def _iso_rows_table(iso_rows: Sequence[CheckpointResult]) -> str:
    trs = []
    for r in iso_rows:
        intro = r.introduces_error
        flag = "introduces error" if intro is True else ("no" if intro is False else "")
        trs.append(f'<tr class="{"fail" if intro is True else ""}"><td>{esc(r.id)}</td>'
                   f"{num_td(r.introduced_error)}{num_td(r.propagated_error)}<td>{esc(flag)}</td>"
                   f"<td>{esc('pass' if r.state else ('FAIL' if r.state is False else '?'))}</td></tr>")
    return ("<table><tr><th>checkpoint</th><th>introduced error</th><th>propagated error</th>"
            f"<th>this layer</th><th>end-to-end verdict</th></tr>{''.join(trs)}</table>")


def _layers_table(layers: Sequence[LayerResult]) -> str:
    trs = []
    for lr in layers:
        ev, v = lr.evidence, lr.verdict
        attention = _error(ev.attention.error) if v.attention is not None and ev.attention is not None else None
        mlp = _error((ev.mlp or ev.whole).error) if v.mlp is not None else None
        growth = lr.accumulation()
        trs.append(f'<tr class="{"fail" if lr.introduces else ""}"><td class="num">{esc(lr.layer)}</td>'
                   f"<td>{esc('YES' if lr.introduces else 'no')}</td><td>{esc(lr.block)}</td>{num_td(attention)}"
                   f"{num_td(mlp)}{num_td(_error(ev.carried_in))}{num_td(_error(ev.total))}"
                   + "".join(num_td(growth[k]) for k in _GROWTH) + "</tr>")
    return ("<h3>Per layer (engine)</h3><p>Each block replayed alone on the reference's input to it: the "
            "attention on the layer's input, the MLP on the post-attention state (max abs error).</p>"
            "<table><tr><th>layer</th><th>introduces error</th><th>block</th>"
            "<th>attention introduces</th><th>mlp introduces</th><th>carried in</th><th>total</th>"
            "<th>carried in (RMSE)</th>"
            "<th>carried out (RMSE)</th><th>growth</th><th>a correct run's growth</th></tr>"
            + "".join(trs) + "</table><p>Growth: carried out / carried in through the layer; beside it the "
            "calibration run's own (accumulated rounding of a correct implementation at the same "
            "precision). A layer that only accumulates grows the error about as a correct run does.</p>")


def _isolation(result: ValidationResult) -> str:
    """Per-checkpoint introduced/propagated error and the engine's per-layer isolation list."""
    iso_rows = isolation_rows(result.results)
    layers = result.isolation or []
    found = result.introducing()
    if not iso_rows and not layers and not found and not result.isolation_note:
        return ""
    parts = []
    if found is not None:
        parts.append(f'<p id="introducing-layers" class="note">Layers that introduce error on their own: '
                     f"<strong>{esc(introducing_text(found))}</strong></p>")
    if result.isolation_note:
        parts.append(f'<p class="note">{esc(result.isolation_note)}</p>')
    source = result.source
    if source is not None:
        parts.append(f'<p id="error-source" class="note">Source of the error: '
                     f'<strong>{esc(error_source_text(source))}</strong>: {esc(source.detail)}</p>')
    series = _row_series(iso_rows) if iso_rows else _layer_series(layers)
    labels = [r.id for r in iso_rows] if iso_rows else [f"layer {lr.layer}" for lr in layers]
    if series:
        svg = line_chart("introduced vs propagated error", labels,
                         [("introduced", [s[0] for s in series], "#dd6b20"),
                          ("propagated", [s[1] for s in series], "#2b6cb0"),
                          ("introduced bound", [s[2] for s in series], _BOUND)],
                         log=True, chart_id="isolation", width=760)
        if svg:
            parts.append(f'<div class="charts">{svg}</div>')
    parts.append("<p>Introduced: the error a layer adds when the alternative runs it on the reference's input to "
                 "that layer. Propagated: the error carried in from earlier layers (end-to-end run).</p>")
    if iso_rows:
        parts.append(_iso_rows_table(iso_rows))
    if layers:
        parts.append(_layers_table(layers))
    return section("isolation", "Isolation: introduced vs propagated error", "".join(parts))


def _oracle_noise(result: ValidationResult) -> str:
    parts = []
    o_rows = [r for r in result.results if r.judged_by == "oracle" and r.judgement.rule is not None]
    if result.oracle or o_rows:
        parts.append("<h3>Oracle (float64 python_reference)</h3>")
        if result.oracle:
            parts.append(kv_table(result.oracle))
        if o_rows:
            keys = ("reference_error", "alternative_error", "multiplier", "floor", "bound", "ratio")
            trs = "".join(f'<tr class="{"fail" if r.state is False else ""}"><td>{esc(r.id)}</td>'
                          + "".join(num_td(getattr(r.judgement.rule, k)) for k in keys)
                          + f"<td>{esc(r.state)}</td></tr>" for r in o_rows)
            parts.append("<table><tr><th>checkpoint</th>" + "".join(f"<th>{esc(k)}</th>" for k in keys)
                         + f"<th>passed</th></tr>{trs}</table>")
    n_rows = [r for r in result.results if r.run_to_run is not None]
    if result.noise_floor or n_rows:
        parts.append("<h3>Noise floor (run-to-run)</h3>")
        if result.noise_floor:
            parts.append(kv_table(result.noise_floor))
        if n_rows:
            trs = "".join(f"<tr><td>{esc(r.id)}</td><td>{_cell(r.run_to_run or {})}</td></tr>" for r in n_rows)
            parts.append(f"<table><tr><th>checkpoint</th><th>max |run1 - run2|</th></tr>{trs}</table>")
    return section("oracle", "Oracle and noise floor", "".join(parts)) if parts else ""


def _cell(d: Mapping[str, float]) -> str:
    return esc(", ".join(f"{k}={fmt_num(v)}" for k, v in d.items()))


def _indices(values: list[int], shown: int = 24) -> str:
    """``0, 3, 17`` (the first ``shown``, then how many more)."""
    more = f" and {len(values) - shown} more" if len(values) > shown else ""
    return ", ".join(str(v) for v in values[:shown]) + more


#: The heatmap's largest drawing (px) and its largest cell: a small matrix (a 4 x 4 tensor) is drawn
#: with large cells, readable, a large one with a pixel per cell or block.
HEAT_MAX_W, HEAT_MAX_H, HEAT_MAX_CELL = 900, 420, 64


def heat_scale(rows: int, cols: int) -> int:
    """Pixels per cell of a ``rows`` x ``cols`` heatmap: as large as fits in ``HEAT_MAX_W`` x
    ``HEAT_MAX_H`` px, at most ``HEAT_MAX_CELL``, at least 1."""
    return max(1, min(HEAT_MAX_CELL, int(min(HEAT_MAX_W / max(cols, 1), HEAT_MAX_H / max(rows, 1)))))


def _dtype_text(config: Mapping[str, object], alternative: str | None) -> str | None:
    """``bfloat16 (reference float64)``: the alternative's compute dtype and the reference's."""
    alt = alternative or config.get("dtype")
    ref = config.get("reference_dtype")
    if alt is None and ref is None:
        return None
    return f"{alt or 'backend default'}" + (f" (reference {ref})" if ref else "")


def _heatmap(hm: Heatmap | None, worst: CheckpointResult | None) -> str:
    if worst is None:
        return section("heatmap", "Heatmap of the worst checkpoint", '<p class="muted">no checkpoint has an error figure</p>')
    label = worst.id
    if hm is None:
        return section("heatmap", f"Heatmap of the worst checkpoint: {label}",
                        '<p class="muted">no recorded tensors and no worst-element list for this checkpoint</p>')
    rgb, vmin, vmax = colorize(hm.matrix)
    h, w = rgb.shape[0], rgb.shape[1]
    scale = heat_scale(h, w)
    source_note = ("Source: <strong>recorded tensors</strong> (|alternative - reference| of every element)."
                   if hm.source == "recorded tensors" else
                   "Source: <strong>worst-element list</strong> (no recorded tensors): only the k worst elements the "
                   "comparison kept are placed; grey cells are unknown, not zero.")
    desc = (f"Tensor shape {esc(hm.full_shape)} shown as {esc(hm.rows)} rows (all leading dims flattened) x "
            f"{esc(hm.cols)} columns (last dim)")
    if hm.block != (1, 1):
        desc += f"; each pixel is the max over a block of {esc(hm.block[0])} x {esc(hm.block[1])} elements"
    if hm.row_labels is not None and hm.col_labels is not None:
        desc += (f"; drawn over only the {len(hm.row_labels)} row(s) and {len(hm.col_labels)} column(s) that hold "
                 f"a worst element: rows {esc(_indices(hm.row_labels))}, columns {esc(_indices(hm.col_labels))}")
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in hm.notes)
    body = (f'<p class="note" data-source="{esc(hm.source)}">{source_note}</p>{notes}<p>{desc}.</p>'
            f'<img class="heat" alt="error heatmap of {esc(label)}" width="{w * scale}" height="{h * scale}" '
            f'src="{png_data_uri(rgb)}">'
            f"<div>{colorbar_svg(vmin, vmax)}</div>")
    return section("heatmap", f"Heatmap of the worst checkpoint: {label}", body)


def _tensorssection(report: ReportSource, store: TensorStore | None, max_values: int) -> str:
    recs = report.tensor_recordings
    if not recs:
        return section("tensors", "Recorded tensors", '<p class="muted">no tensors were recorded for this session</p>')
    trs = []
    for rec in recs:
        s = tensor_summary(rec, store, max_values=max_values)
        vals = s.get("values")
        preview = ""
        if vals is not None:
            preview = esc(", ".join(fmt_num(v, 5) for v in vals[:32]) + (" ..." if len(vals) > 32 or s.get("values_truncated") else ""))
        trs.append(
            f"<tr><td>{esc(s.get('tensor_name'))}</td><td>{esc(s.get('side'))}</td><td>{esc(s.get('shape'))}</td>"
            f"<td>{esc(s.get('dtype'))}</td>{num_td(s.get('min'))}{num_td(s.get('max'))}{num_td(s.get('mean'))}"
            f"{num_td(s.get('std'))}{num_td(s.get('nan_count'))}{num_td(s.get('inf_count'))}"
            f"<td>{esc(s.get('error')) if s.get('error') else preview}</td>"
            f"<td><code>{esc((s.get('content_hash') or '')[:12])}</code></td></tr>")
    return section("tensors", "Recorded tensors",
                    "<div class=\"scroll\"><table><tr><th>name</th><th>side</th><th>shape</th><th>dtype</th><th>min</th>"
                    "<th>max</th><th>mean</th><th>std</th><th>NaN</th><th>inf</th><th>first values</th><th>sha256</th></tr>"
                    f"{''.join(trs)}</table></div>")


def render_html(report: ReportSource, *, include_tensors: bool = False, store: TensorStore | None = None,
                max_tensor_values: int = 256) -> str:
    """The full HTML report of ``report`` (a :class:`ReportSource` of a stored session).

    ``store``: the tensor store holding the session's recordings; default: the one beside the
    session's database when it exists. ``include_tensors`` adds a table of every recorded tensor
    (statistics and the first values).
    """
    view = stored(report)
    session, result, rows = view.record, view.result, view.rows
    status = view.status
    verdict = view.verdict
    first = view.first_divergence
    first_index = next((i for i, r in enumerate(rows) if r is first), None)
    worst = worst_row(rows)
    store = open_store(store, report.tensor_store_root) if (report.tensor_recordings or store is not None) else None
    heat = heatmap_for(worst, report.tensor_recordings, store) if worst is not None else None

    n_pass = sum(1 for r in rows if r.state is True)
    n_fail = sum(1 for r in rows if r.state is False)
    diagnosis = result.precision_diagnosis or {}
    quantized, emulated = diagnosis.get("quantized"), diagnosis.get("emulated")
    consistent = "" if not result.consistent_with else precision_text(
        result.consistent_with, result.alternative_dtype or "dtype", quantized if isinstance(quantized, Mapping) else None,
        emulated if isinstance(emulated, Mapping) else None)
    if first is None:
        fd_text = "none: every checkpoint within tolerance" if rows else "none (no checkpoint results stored)"
    else:
        fd_text = f"{first.id} (max abs error {fmt_num(first.comparison.max_abs_error)}"
        fd_text += (f"; {first.reason}" if first.reason else "") + ")"
    found = result.introducing()
    sees = sensitivity_text(result.sensitivity(), finest=True)
    source = result.source
    culprits = drilldown_culprits(result.drilldown)
    damaged = damaged_fields(session, report.checkpoint_results)
    verdict_box = (
        f'<section id="verdict" class="verdict {_verdict_class(verdict)}">'
        f'<div class="big">{esc(verdict.upper())}</div>'
        f"<div>session status <strong>{esc(status)}</strong>; {esc(len(rows))} checkpoints: {esc(n_pass)} passed, "
        f"{esc(n_fail)} failed, {esc(len(rows) - n_pass - n_fail)} without a verdict</div>"
        f'<div id="first-divergence">first divergence: <strong>{esc(fd_text)}</strong></div>'
        + (f"<div>worst checkpoint: {esc(worst.id)} (max abs error {esc(fmt_num(worst.comparison.max_abs_error))})</div>"
           if worst is not None else "")
        + (f'<div id="consistent-with">{esc(consistent)}</div>' if consistent else "")
        + (f'<div id="sensitivity">sensitivity: {esc(sees)}</div>' if sees else "")
        + (f'<div id="summary-introducing">layers that introduce error (isolation): '
           f"{esc(introducing_text(found))}</div>" if found is not None else "")
        + (f'<div id="summary-source">source of the error: {esc(error_source_text(source))}</div>'
           if source is not None else "")
        + (f'<div id="culprit-summary">culprit operator (drill-down): <strong>{esc(culprits)}</strong> '
           '<a href="#drilldown">details</a></div>' if culprits else "")
        + (f"<div>error: {esc(session.error_message)}</div>" if session.error_message else "")
        + (f'<div id="damaged">damaged JSON in the database (shown as not recorded): {esc(", ".join(damaged))}</div>'
           if damaged else "")
        + "</section>")

    summary: dict[str, object] = {
        "session id": session.session_id,
        "model path": session.model_path or None,
        "weights digest": session.weights_digest,
        "reference backend": session.reference_backend or None,
        "alternative backend": backend_label(session.alternative_backend, result.alternative_options,
                                             result.alternative_dtype or None),
        "dtype": _dtype_text(session.config, result.alternative_dtype or None),
        "seed": session.seed,
        "inputs": session.inputs_ref,
        "created": session.created_at,
        "started": session.started_at,
        "finished": session.finished_at,
        "tensor recordings": result.recordings,
    }
    summary_html = kv_table({k: v for k, v in summary.items() if v is not None})
    sentences = input_sentences(session)
    if sentences:
        summary_html += (f"<h3>Input sentences ({len(sentences)})</h3>"
                         + lines_list(sentences, "lines sentences").replace("<ol ", '<ol id="input-sentences" ', 1))

    perf = result.performance or report.performance_metrics or None
    cmd, exact = reproduce_command(session, result)
    if cmd is None:
        repro = '<p class="muted">not recorded</p>'
    else:
        repro = (f"<pre id=\"command\">{esc(cmd)}</pre>" +
                 ("<p class=\"muted\">the command that ran this session, as recorded by the engine when it was created</p>"
                  if exact else
                  '<p class="note">No command was recorded with this session (it was created through the API); '
                  "this one is rebuilt from the stored session (model path, backends, dtype, tolerances, seed, "
                  "the text inputs and the main config options; arguments with control or bidi characters are "
                  "written as $'...' escapes). A user backend needs its --backend-file or --backend-module, "
                  "and config keys without an option need --config-file.</p>"))
    other = {k: v for k, v in session.results.items() if k not in _SHOWN_RESULT_KEYS}

    sections = [
        verdict_box,
        section("summary", "Session", summary_html),
        section("curves", "Per-layer error", _curves(rows, first_index)),
        section("checkpoints", "Checkpoints", _checkpoint_table(rows, first, bool(isolation_rows(rows)))
                 if rows else '<p class="muted">no checkpoint results stored</p>'),
        decode_section(result),
        _isolation(result),
        inspector_section(result),
        quantized_section(result, session),
        drilldown_section(result.drilldown),
        _heatmap(heat, worst),
        _oracle_noise(result),
        performance_section(perf),
        _tensorssection(report, store, max_tensor_values) if include_tensors else "",
        backends_section(session),
        tolerances_section(session, rows),
        section("config", "Configuration", kv_table(session.config or None)),
        section("environment", "Environment", kv_table(session.environment or None)),
        section("reproduce", "Reproduce this run", repro),
        section("other-results", "Other results", kv_table(other)) if other else "",
    ]
    nav = "".join(f'<a href="#{sid}">{esc(t)}</a>' for sid, t in (
        ("drilldown", "culprit operator"), ("curves", "error curves"), ("checkpoints", "checkpoints"),
        ("decode", "decode steps"), ("isolation", "isolation"), ("quantized", "quantized modules"), ("heatmap", "heatmap"),
        ("performance", "performance"), ("backends", "backends"), ("environment", "environment"),
        ("reproduce", "reproduce")) if f'id="{sid}"' in "".join(sections))
    generated = report.created_at.isoformat(timespec="seconds") if report.created_at else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Validation report {esc(report.session_id)}</title><style>{BASE_CSS}</style></head>\n<body>"
        f"<h1>Validation report: {esc(session.model_path)}</h1>"
        f"<p class=\"muted\">{esc(session.reference_backend)} (reference) vs "
        f"{esc(session.alternative_backend)} (alternative) &middot; session <code>{esc(report.session_id)}</code></p>"
        f"<nav>{nav}</nav>"
        + "\n".join(s for s in sections if s)
        + f'<footer><p class="muted">report {esc(report.report_id)} generated {esc(generated)} by debug_framework</p>'
        "</footer></body></html>\n"
    )


# ----------------------------------------------------------------------------- diff


def _record(rep: SessionSource) -> SessionRecord:
    """A diff side's session row as its record (its status the side's overall status)."""
    record = SessionRecord.from_row({"session_id": rep.session_id, **(rep.session or {})})
    return replace(record, status=rep.overall_status or record.status)


def render_diff_html(diff: DiffSource, before: SessionSource, after: SessionSource) -> str:
    """Cross-session report: which checkpoints got better or worse from ``before`` to ``after``."""
    counts = diff.counts
    labels = [c.id for c in diff.changes]
    series = [("before", [c.before_max_abs_error for c in diff.changes], "#718096"),
              ("after", [c.after_max_abs_error for c in diff.changes], "#c53030")]
    after_rows = stored(after).rows
    if after_rows:  # the bound each checkpoint of the "after" session was judged by, in max abs units
        bounds = dict(zip((r.id for r in after_rows), _bound_values(after_rows, "max_abs_error")))
        series.append(("after's bound", [bounds.get(c.id) for c in diff.changes], _BOUND_AFTER))
    chart = line_chart("max |alt - ref| per checkpoint", labels, series, log=True, width=900, chart_id="diff")
    trs = []
    for c in diff.changes:
        b, a = as_float(c.before_max_abs_error), as_float(c.after_max_abs_error)
        ratio = ""
        if b is not None and a is not None and math.isfinite(a) and math.isfinite(b) and b > 0:
            ratio = fmt_num(a / b, 3)
        pv = lambda p: "pass" if p is True else ("FAIL" if p is False else "")  # noqa: E731
        trs.append(f'<tr class="{esc(c.change)}"><td>{esc(c.id)}</td><td class="num">{esc(fmt_num(c.layer))}</td>'
                   f"<td>{esc(pv(c.before_passed))}</td><td>{esc(pv(c.after_passed))}</td>"
                   f"{num_td(c.before_max_abs_error)}{num_td(c.after_max_abs_error)}<td class=\"num\">{esc(ratio)}</td>"
                   f'<td class="change">{esc(c.change)}</td></tr>')
    worse = diff.counts["worse"]
    cls = "bad" if worse else "ok"
    headline = f"{worse} checkpoint(s) got worse" if worse else "nothing got worse"

    def side(title: str, rep: SessionSource) -> str:
        s = _record(rep)
        return (f"<h3>{esc(title)}</h3>" + kv_table({
            "session id": rep.session_id, "status": rep.overall_status, "verdict": verdict_of(s),
            "model path": s.model_path, "weights digest": s.weights_digest,
            "reference backend": s.reference_backend, "alternative backend": s.alternative_backend,
            "created": s.created_at}))

    notes = "".join(f"<li>{esc(n)}</li>" for n in diff.notes)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
        f"<title>Session diff {esc(diff.before_session_id)} -&gt; {esc(diff.after_session_id)}</title>"
        f"<style>{BASE_CSS}</style></head>\n<body>"
        f"<h1>Session diff: {esc(_record(before).model_path)}</h1>"
        f'<section id="verdict" class="verdict {cls}"><div class="big">{esc(headline)}</div>'
        f"<div>{' &middot; '.join(f'{esc(k)}: {esc(v)}' for k, v in counts.items())}</div></section>"
        f'<section id="sessions"><h2>Sessions</h2><div class="charts"><div>{side("before", before)}</div>'
        f"<div>{side('after', after)}</div></div></section>"
        + (f'<section id="notes"><h2>What differs between the runs</h2><ul>{notes}</ul></section>' if notes else "")
        + (f'<section id="curves"><h2>Error per checkpoint</h2><div class="charts">{chart}</div></section>' if chart else "")
        + '<section id="changes"><h2>Checkpoints</h2><div class="scroll"><table><tr><th>checkpoint</th><th>layer</th>'
        "<th>before</th><th>after</th><th>before max abs</th><th>after max abs</th><th>after / before</th><th>change</th>"
        f"</tr>{''.join(trs)}</table></div></section>"
        "</body></html>\n"
    )
