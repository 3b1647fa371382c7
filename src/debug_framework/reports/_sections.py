"""Sections of the session report that are tables rather than error charts: performance (peak memory
in binary units), backends and tolerances (identical per-checkpoint tolerances collapsed into one row
naming every checkpoint that shares it); and the two cell/section helpers every section uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..jsonio import JsonValue, dumps_json
from ..storage.session_record import SessionRecord
from ._common import as_float, fmt_num, human_bytes
from ._html import esc, json_pre, kv_table, line_chart

if TYPE_CHECKING:
    from ..services.validation.results import CheckpointResult

__all__ = ["num_td", "section", "performance_section", "backends_section", "tolerances_section", "memory_cell",
           "METRIC_LABELS", "metric_label", "change_text", "sensitivity_text", "judged_caption"]

#: How each judged metric is named beside its bound in the checkpoint tables.
METRIC_LABELS = {"rmse": "RMSE", "max_abs_error": "max abs", "kl_divergence": "KL", "allclose": "allclose",
                 "cosine_distance": "1 - cos", "sqnr_db": "SQNR dB"}


def metric_label(metric: str | None) -> str:
    """A judged metric's short name (``"RMSE"``, ``"KL"``; ``"-"`` for none)."""
    return "-" if metric is None else METRIC_LABELS.get(metric, metric)


def judged_caption(rows: Sequence[CheckpointResult]) -> str:
    """The caption naming what a checkpoint table's ``judged`` and ``sees`` columns are: the metrics
    held to the bounds (the terminal's and the dashboard's)."""
    metrics = sorted({metric_label(r.judged_metric) for r in rows if r.judged_metric is not None})
    held = ", ".join(metrics) if metrics else "none recorded"
    return (f"judged: the error held to bound ({held}), margin = judged / bound; sees: the smallest relative "
            "change of the output the bound would catch")


def change_text(change: float | None) -> str:
    """A relative change as a percentage in a few characters (``0.83%``, ``12%``; ``-`` for none)."""
    if change is None:
        return "-"
    pct = 100.0 * change
    return f"{pct:.2g}%" if pct < 100 else f"{pct:.0f}%"


def sensitivity_text(found: Mapping[str, JsonValue] | None, finest: bool = False) -> str | None:
    """:meth:`ValidationResult.sensitivity` in words: ``at bfloat16 this run can see a relative
    change of 3.8% at post_mlp:1 and no smaller``; with ``finest``, the finest checkpoint's figure
    too and what a smaller change does (None: no checkpoint has a figure)."""
    if not found:
        return None
    coarsest, best = found.get("coarsest"), found.get("finest")
    if not isinstance(coarsest, Mapping) or not isinstance(best, Mapping):
        return None
    text = (f"at {found.get('dtype') or 'its precision'} this run can see a relative change of "
            f"{change_text(as_float(coarsest.get('change')))} at {coarsest.get('id')} and no smaller")
    if not finest:
        return text
    if best.get("id") != coarsest.get("id"):
        text += f" (the finest: {change_text(as_float(best.get('change')))} at {best.get('id')})"
    return text + "; a smaller change of a checkpoint's output passes there as rounding noise"


def num_td(v: object) -> str:
    """A right-aligned number cell."""
    return f'<td class="num">{esc(fmt_num(v))}</td>'


def section(sid: str, title: str, body: str) -> str:
    """``<section id=sid><h2>title</h2>body</section>`` (id and title escaped)."""
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>{body}</section>'


def performance_section(perf: JsonValue) -> str:
    if not perf:
        return section("performance", "Performance", '<p class="muted">not recorded</p>')
    if not isinstance(perf, Mapping):
        return section("performance", "Performance", json_pre(perf))
    parts = []
    sides = [(k, v) for k, v in perf.items() if isinstance(v, Mapping) and k in ("reference", "alternative", "oracle")]
    if sides:
        cols = ("prepare_s", "forward_s", "wall_s")
        trs = "".join(f"<tr><td>{esc(k)}</td>{''.join(num_td(v.get(c)) for c in cols)}"
                      f"<td>{memory_cell(v.get('memory'))}</td></tr>" for k, v in sides)
        parts.append("<table><tr><th>backend</th><th>prepare (s)</th><th>forward (s)</th><th>wall (s)</th>"
                     f"<th>peak memory</th></tr>{trs}</table>")
        per_layer = []
        for k, v in sides:
            pl = v.get("per_layer_s")
            if isinstance(pl, Mapping):
                pl = [pl[x] for x in sorted(pl, key=lambda t: int(t) if str(t).lstrip("-").isdigit() else 0)]
            if isinstance(pl, list) and pl and all(as_float(x) is not None for x in pl):
                per_layer.append((k, pl))
        if per_layer:
            n = max(len(pl) for _, pl in per_layer)
            colours = {"reference": "#2b6cb0", "alternative": "#c53030", "oracle": "#718096"}
            svg = line_chart("wall time per layer (s)", [f"layer {i}" for i in range(n)],
                             [(k, list(pl) + [None] * (n - len(pl)), colours.get(k, "#2f855a")) for k, pl in per_layer],
                             log=True, chart_id="per_layer_time", width=760)
            if svg:
                parts.append(f'<div class="charts">{svg}</div>')
    parts.append("<details><summary>all performance figures</summary>" + kv_table(perf) + "</details>"
                 if sides else kv_table(perf))
    return section("performance", "Performance", "".join(parts))


def memory_cell(mem: JsonValue) -> str:
    """Peak memory in binary units: ``1011 MiB (+66.8 MiB over 944 MiB at start; rss_vmhwm)``."""
    if mem is None:
        return '<span class="muted">not measured</span>'
    if not isinstance(mem, Mapping):
        return esc(human_bytes(mem) if as_float(mem) is not None else mem)
    peak, delta, base = mem.get("peak_bytes"), mem.get("delta_bytes"), mem.get("baseline_bytes")
    bits = []
    if delta is not None:
        bits.append(f"+{human_bytes(delta)}" + (f" over {human_bytes(base)} at start" if base is not None else ""))
    extra = [f"{k}={fmt_num(v)}" for k, v in mem.items() if k not in {"peak_bytes", "delta_bytes", "baseline_bytes"}
             and not isinstance(v, (Mapping, list))]
    detail = "; ".join([", ".join(bits)] * bool(bits) + extra)
    head = human_bytes(peak) if peak is not None else "peak not measured"
    return (f'<span class="mem" title="{esc(fmt_num(peak))} bytes">{esc(head)}</span>'
            + (f' <span class="muted">({esc(detail)})</span>' if detail else ""))


def backends_section(session: SessionRecord) -> str:
    """Each backend's name and the version information recorded with the session."""
    parts = []
    for side, name, info in (("reference", session.reference_backend, session.reference_backend_info),
                             ("alternative", session.alternative_backend, session.alternative_backend_info)):
        parts.append(f"<h3>{esc(side)}: {esc(name)}</h3>"
                     + (kv_table(info) if info else '<p class="muted">no version information recorded</p>'))
    return section("backends", "Backends", "".join(parts))


def _grouped(pairs: Sequence[tuple[str, JsonValue]]) -> list[tuple[JsonValue, list[str]]]:
    """``(value, names sharing it)`` for each distinct value (compared as JSON), in first-seen order."""
    distinct: dict[str, tuple[JsonValue, list[str]]] = {}
    for name, value in pairs:
        distinct.setdefault(dumps_json(value, indent=None), (value, []))[1].append(name)
    return list(distinct.values())


def _shared_table(groups: Sequence[tuple[JsonValue, list[str]]], cls: str) -> str:
    """One row per distinct tolerance: the tolerance, and every checkpoint that uses it."""
    trs = "".join(f"<tr><td>{kv_table(tol) if isinstance(tol, Mapping) else json_pre(tol)}</td>"
                  f"<td>{'all ' if len(groups) == 1 else ''}{len(names)} checkpoint(s): {esc(', '.join(names))}</td></tr>"
                  for tol, names in groups)
    return (f'<table class="{esc(cls)}"><tr><th>tolerance</th><th>shared by</th></tr>{trs}</table>')


#: How each ``judged_by`` rule is named in the tolerances section.
_RULES = {"calibration": "calibrated bound: noise margin x a correct run's error at this precision + floor",
          "oracle": "ratio rule against the float64 oracle",
          "tolerance": "allclose tolerance (below)",
          "isolation": "calibrated replay of the block that ends here (isolation)"}


def tolerances_section(session: SessionRecord, rows: Sequence[CheckpointResult]) -> str:
    """Session tolerances and the tolerance each checkpoint used, identical tables collapsed into
    one row that names every checkpoint sharing it."""
    tol: dict[str, JsonValue] | None = dict(session.tolerances) if session.tolerances else None
    per = tol.pop("per_checkpoint", None) if tol is not None else None
    judged = [r for r in rows if r.judged]
    rules = _grouped([(r.id, _RULES.get(r.judged_by, r.judged_by)) for r in judged])
    parts = []
    if rules:  # the rule that decided each verdict comes first: it is what the verdict used
        trs = "".join(f"<tr><td>{esc(rule)}</td><td>{len(names)} checkpoint(s): {esc(', '.join(names))}</td></tr>"
                      for rule, names in rules)
        parts.append('<h3>The rule that judged each checkpoint</h3><table class="tol-rule"><tr><th>rule</th>'
                     f"<th>judged</th></tr>{trs}</table>")
    by_tolerance = any(r.judged_by == "tolerance" for r in judged)
    unused = "" if by_tolerance or not rules else (
        '<p class="note">No checkpoint was judged by these allclose tolerances (each was judged by the rule '
        "above); they would judge where calibration is off or precision_thresholds sets one.</p>")
    parts.append("<h3>Session tolerances (allclose)</h3>" + unused + kv_table(tol))
    if isinstance(per, Mapping) and per:
        parts.append("<h4>Per checkpoint (identical ones collapsed)</h4>"
                     + _shared_table(_grouped([(str(k), v) for k, v in per.items()]), "tol-session"))
    used = _grouped([(r.id, r.tolerance.to_dict()) for r in rows if r.tolerance is not None])
    if used:
        parts.append("<h3>Tolerance used per checkpoint</h3>" + _shared_table(used, "tol-used"))
    return section("tolerances", "Tolerances", "".join(parts))
