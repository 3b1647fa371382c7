"""Decode steps in the reports: a step x layer view of margins, the tokens and the KV cache.

:func:`decode_view` turns a session's checkpoint rows and its ``decode`` result (docs/validation.md,
"Decode steps") into one plain :class:`DecodeView`: per pass (step 0 the prefill) the worst margin
(error / bound, at most 1 passes) of each column (``embedding``, each layer, ``head``), the
token-level metrics and their verdict, the KV cache's margins per layer (the worse of K and V), and
the first divergent token. The HTML report draws it with :func:`decode_section`, the terminal with
:func:`decode_text` (where it fits) and the dashboard as data frames, so all three show the same
figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._html import esc
from ._sections import section

if TYPE_CHECKING:
    from ..services.validation.decode_record import FirstToken, TokenRow
    from ..services.validation.results import CheckpointResult, ValidationResult

__all__ = ["Cell", "DecodeView", "decode_view", "decode_section", "decode_text", "margin_text", "token_text",
           "token_failure_text", "step_isolation_text", "served_text", "decode_notes"]


@dataclass(frozen=True)
class Cell:
    """One place at one pass: the worst margin there (None: none measured) and the verdict (None:
    not judged); ``first`` marks the first divergence."""

    margin: float | None
    passed: bool | None
    first: bool = False


@dataclass
class DecodeView:
    """What a decoded session shows, step by step (step 0: the prefill)."""

    columns: list[str]  #: "embedding", the layers ("0", "1", ...), "head"
    steps: list[int]
    margins: dict[int, dict[str, Cell]] = field(default_factory=dict)  #: step -> column -> cell
    tokens: dict[int, TokenRow] = field(default_factory=dict)  #: step -> its token metrics
    kv_layers: list[int] = field(default_factory=list)
    kv: dict[int, dict[int, Cell | None]] = field(default_factory=dict)  #: step -> layer -> the worse of K and V
    first_token: FirstToken | None = None


def _column(row: CheckpointResult) -> str:
    if row.key.name == "post_embedding":
        return "embedding"
    return "head" if row.key.layer is None else str(row.key.layer)


def _worse(cell: Cell | None, margin: float | None, passed: bool | None, first: bool) -> Cell:
    """``cell`` with one more place folded in: the larger margin, failed if either failed."""
    if cell is None:
        return Cell(margin, passed, first)
    margins = [m for m in (cell.margin, margin) if m is not None]
    states = [p for p in (cell.passed, passed) if p is not None]
    return Cell(max(margins) if margins else None, all(states) if states else None, cell.first or first)


def decode_view(result: ValidationResult) -> DecodeView | None:
    """The decode view of a session (None when it decoded no steps)."""
    decode = result.decoded
    if decode is None:
        return None
    first = result.first_divergence
    rows = result.results
    layers = sorted({r.key.layer for r in rows if r.key.layer is not None})
    view = DecodeView(["embedding", *(str(i) for i in layers), "head"], [])
    for r in rows:
        if r.step is None:
            continue
        cells = view.margins.setdefault(r.step, {})
        col = _column(r)
        cells[col] = _worse(cells.get(col), r.margin, r.state, r is first)
    view.tokens = {t.step: t for t in decode.token_metrics}
    for kv in decode.kv_cache:
        cell = view.kv.setdefault(kv.step, {}).get(kv.layer)
        for p in (kv.k, kv.v):
            if p is not None:
                cell = _worse(cell, p.margin, p.passed, False)
        view.kv[kv.step][kv.layer] = cell
    view.kv_layers = sorted({layer for cells in view.kv.values() for layer in cells})
    view.steps = sorted(set(view.margins) | set(view.tokens) | set(view.kv))
    view.first_token = decode.first_divergent_token
    return view


def margin_text(margin: float | None, passed: bool | None = None) -> str:
    """A margin in at most 6 characters (``0.24``, ``2.8e5``, ``inf``; ``FAIL`` for a failure
    without one, ``-`` for nothing measured)."""
    if margin is None or math.isnan(margin):
        return "FAIL" if passed is False else "-"
    if math.isinf(margin):
        return "inf"
    if margin < 1000:
        return f"{margin:.2g}" if margin < 10 else f"{margin:.0f}"
    mantissa, exp = f"{margin:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def token_text(token: FirstToken | None) -> str:
    """The first divergent token in words."""
    if token is None:
        return "first divergent token: none (every top-1 token agrees, or differs only at a near tie)"
    where = "the prefill" if token.step == 0 else f"decode step {token.step}"
    return (f"first divergent token: {where}, logits index {token.index}: the alternative chooses token "
            f"{token.alternative_token} where the reference chooses {token.reference_token} "
            f"(reference logit gap {token.reference_gap or 0:.3g})")


def _verdict(t: TokenRow | None) -> str:
    return "" if t is None else ("pass" if t.passed else ("FAIL" if t.passed is False else "?"))


def _figure(value: float | None) -> str:
    return "-" if value is None else str(value)


def _kl_failed(t: TokenRow) -> bool:
    """Whether the mean KL divergence failed the pass (beyond its bound; a row stored without
    ``failed_by``: its margin over 1)."""
    if t.passed is not False:
        return False
    return "kl_divergence" in t.failed_by if t.failed_by else (t.margin is not None and t.margin > 1)


def _top1_failed(t: TokenRow) -> bool:
    """Whether the top-1 tokens failed the pass (more flipped beyond noise than a correct run flips)."""
    if t.passed is not False:
        return False
    return "top1" in t.failed_by if t.failed_by else not _kl_failed(t)


def _kl_text(t: TokenRow | None) -> str:
    return "-" if t is None or t.kl_mean is None else f"{t.kl_mean:.1e}"


def _kl_bound_text(t: TokenRow | None) -> str:
    return "-" if t is None or t.bound is None else f"{t.bound:.1e}"


def _token_td(t: TokenRow | None, metric: str, text: str) -> str:
    """A token metric's cell, marked failed (``*``) where this metric failed the pass."""
    failed = t is not None and (_kl_failed(t) if metric == "kl_divergence" else _top1_failed(t))
    return f'<td class="num{" fail" if failed else ""}">{esc(text + ("*" if failed else ""))}</td>'


def token_failure_text(view: DecodeView) -> list[str]:
    """One line per failing pass: which token metric failed and against what (the judge's reason)."""
    lines = []
    for s in view.steps:
        t = view.tokens.get(s)
        if t is None or t.passed is not False:
            continue
        what = [w for w, failed in (("its top-1 tokens", _top1_failed(t)),
                                    (f"mean KL {_kl_text(t)} > bound {_kl_bound_text(t)}", _kl_failed(t))) if failed]
        lines.append(f"tokens fail at step {s} by {' and '.join(what)}: {t.reason or 'no reason recorded'}")
    return lines


def _td(cell: Cell | None) -> str:
    if cell is None:
        return '<td class="num muted">&ndash;</td>'
    cls = "first" if cell.first else ("fail" if cell.passed is False else "pass")
    return f'<td class="num {cls}">{esc(margin_text(cell.margin, cell.passed))}</td>'


def decode_section(result: ValidationResult) -> str:
    """The HTML section ``decode`` (empty without decode steps): margins by step and layer with the
    tokens' figures, the first divergent token, the isolation at the first divergent step (where
    layers were replayed there), and the KV cache's margins by step and layer."""
    view = decode_view(result)
    if view is None:
        return ""
    head = "".join(f"<th>{esc(c)}</th>" for c in view.columns)
    body = []
    for s in view.steps:
        t = view.tokens.get(s)
        tcls = "fail" if t is not None and t.passed is False else ""
        body.append(
            f"<tr><td class=\"num\">{esc(s)}{' (prefill)' if s == 0 else ''}</td>"
            + "".join(_td(view.margins.get(s, {}).get(c)) for c in view.columns)
            + _token_td(t, "kl_divergence", _kl_text(t)) + f'<td class="num">{esc(_kl_bound_text(t))}</td>'
            + _token_td(t, "top1", "-" if t is None else _figure(t.top1_agreement))
            + f'<td class="num">{esc("-" if t is None else _figure(t.topk_overlap))}</td>'
            + f'<td class="{tcls}" title="{esc("" if t is None else t.reason or "")}">{esc(_verdict(t))}</td></tr>')
    parts = ['<p class="muted">Each cell: the worst margin (error / bound, at most 1 passes) of that pass\'s '
             "checkpoints in that layer; step 0 is the prefill. KL: mean KL divergence of the next-token "
             "distributions (nats), held to the KL bound beside it; top-1 / top-k: agreement with the reference's "
             "tokens (top-1 fails where more tokens flip beyond noise than a correct run flips). The metric that "
             "failed a pass is marked.</p>",
             f'<div class="scroll"><table class="decode-grid"><thead><tr><th>step</th>{head}<th>KL mean</th>'
             f"<th>KL bound</th><th>top-1</th><th>top-k</th><th>tokens</th></tr></thead><tbody>{''.join(body)}</tbody>"
             "</table></div>",
             *(f'<p class="token-failure">{esc(line)}</p>' for line in token_failure_text(view)),
             f'<p id="first-divergent-token">{esc(token_text(view.first_token))}</p>',
             *(f'<p id="step-isolation">{esc(line)}</p>' for line in step_isolation_text(result)),
             *(f'<p id="served">{esc(line)}</p>' for line in served_text(result)),
             *(f'<p class="decode-note">{esc(line)}</p>' for line in decode_notes(result))]
    if view.kv:
        kv_head = "".join(f"<th>{esc(i)}</th>" for i in view.kv_layers)
        kv_body = "".join(
            f'<tr><td class="num">{esc(s)}</td>' + "".join(_td(view.kv[s].get(i)) for i in view.kv_layers) + "</tr>"
            for s in sorted(view.kv))
        parts.append("<h3>KV cache after each pass (the worse of K and V, by layer)</h3>"
                     f'<div class="scroll"><table class="kv-grid"><thead><tr><th>step</th>{kv_head}</tr></thead>'
                     f"<tbody>{kv_body}</tbody></table></div>")
    return section("decode", "Decode steps: margins by step and layer", "".join(parts))


def decode_text(result: ValidationResult, width: int = 80) -> list[str]:
    """The step x layer margins as plain lines for a terminal of ``width`` columns (a ``*`` marks a
    failure, ``<`` the first divergence); one line saying where to look when the grid is wider."""
    view = decode_view(result)
    if view is None:
        return []
    cols = [("emb" if c == "embedding" else c) for c in view.columns]
    line_width = 5 + 8 * len(cols) + 26
    if line_width > min(width, 80):
        return [f"decode: {len(view.steps) - 1} step(s) x {len(cols) - 2} layer(s): the step x layer margins are in "
                "the HTML report (--output-file report.html) and the JSON", *token_failure_text(view),
                token_text(view.first_token),
                *step_isolation_text(result), *served_text(result), *decode_notes(result)]

    def cell(c: Cell | None) -> str:
        if c is None:
            return "- ".rjust(8)
        mark = "<" if c.first else ("*" if c.passed is False else " ")
        return (margin_text(c.margin, c.passed) + mark).rjust(8)

    lines = ["margins per step x layer (* fails, < first divergence; step 0: the prefill)",
             "step " + "".join(c.rjust(7) + " " for c in cols) + "KL mean".rjust(9) + "KL bound".rjust(10)
             + "top-1".rjust(7)]
    for s in view.steps:
        t = view.tokens.get(s)
        top1 = "-" if t is None or t.top1_agreement is None else f"{t.top1_agreement:.2f}"
        kl = _kl_text(t) + ("*" if t is not None and _kl_failed(t) else "")
        lines.append(f"{s:>4} " + "".join(cell(view.margins.get(s, {}).get(c)) for c in view.columns)
                     + kl.rjust(9) + _kl_bound_text(t).rjust(10)
                     + (top1 + ("*" if t is not None and _top1_failed(t) else "")).rjust(7))
    lines += token_failure_text(view)
    lines.append(token_text(view.first_token))
    bad_kv = sorted((s, i) for s, cells in view.kv.items() for i, c in cells.items() if c is not None and c.passed is False)
    if view.kv:
        lines.append("KV cache: every layer's K and V within a correct run's bound after every pass" if not bad_kv else
                     "KV cache beyond its bound: " + ", ".join(f"layer {i} after step {s}" for s, i in bad_kv[:6])
                     + (" ..." if len(bad_kv) > 6 else ""))
    return lines + step_isolation_text(result) + served_text(result) + decode_notes(result)


def served_text(result: ValidationResult) -> list[str]:
    """One line for a served model (``decode["served"]``): the endpoint, how it was asked and, for a
    run cut short, what it answered before its error; none for any other session."""
    info = None if result.decoded is None else result.decoded.info.get("served")
    if not isinstance(info, dict):
        return []
    seconds = info.get("seconds")
    line = (f"served: {info.get('url')} ({info.get('protocol')}, model {info.get('model')}): {info.get('requests')} "
            f"request(s), {info.get('retried') or 0} retried, {info.get('positions')} of {info.get('asked')} position(s) "
            f"answered with their top-{info.get('top_k')} log-probabilities"
            + (f" in {seconds:.3g} s" if isinstance(seconds, (int, float)) else ""))
    if info.get("partial"):
        line += f"; cut short: {info.get('error')}"
    return [line]


def step_isolation_text(result: ValidationResult) -> list[str]:
    """One line: which layers failing at the first divergent decode step introduce error there
    (replayed at that step on the reference's input) and which carry it in; none without those replays."""
    iso = None if result.decoded is None else result.decoded.isolation
    if iso is None or not iso.layers:
        return []
    introduce = [str(r.layer) for r in iso.layers if r.introduces]
    carry = [str(r.layer) for r in iso.layers if not r.introduces]
    parts = [f"layer(s) {', '.join(introduce)} introduce error there"] if introduce else []
    parts += [f"layer(s) {', '.join(carry)} only carry it in"] if carry else []
    return [f"isolation at decode step {iso.step}: " + "; ".join(parts)]


def decode_notes(result: ValidationResult) -> list[str]:
    """Where the decode stopped early (``--stop-at-first-divergence``) and whether the first divergent
    decode step's tokens replayed as one prefill tell a cache bug from an accumulation
    (``decode["prefill_equivalence"]``); none where neither applies."""
    decoded = result.decoded
    if decoded is None:
        return []
    lines = []
    if decoded.info.get("stopped_at_first_divergence"):
        lines.append(f"decode stopped at its first divergent step, {decoded.info.get('first_failed_step')} of "
                     f"{decoded.info.get('steps')} (--stop-at-first-divergence)")
    if decoded.prefill_equivalence is not None:
        lines.append(decoded.prefill_equivalence.text())
    return lines
