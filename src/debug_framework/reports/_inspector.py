"""An engine's own numerical evidence beside our per-layer judgement (``ValidationResult.inspector``:
the engine names its tool in the record's ``tool``; the first is the .pte engine's Inspector).

:func:`inspector_view` lines up, per place in the model (embedding, each layer, head), our worst
margin and verdict there with the Inspector's worst gap and operator there; the HTML report draws it
with :func:`inspector_section`, the terminal with :func:`inspector_text`, so both show the same figures.
Where the Inspector failed, both say so and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._decode import margin_text
from ._html import esc
from ._sections import section

if TYPE_CHECKING:
    from ..services.validation.results import CheckpointResult, ValidationResult

__all__ = ["InspectorRow", "inspector_view", "inspector_text", "inspector_section"]


@dataclass(frozen=True)
class InspectorRow:
    """One place in the model: our worst margin and verdict there (None: no checkpoint judged there)
    and the Inspector's operators, worst gap and its operator there (None: none compared there)."""

    place: str
    margin: float | None
    passed: bool | None
    operators: int | None
    gap: float | None
    operator: str | None


def _place(row: CheckpointResult) -> str:
    if row.key.layer is not None:
        return f"layer {row.key.layer}"
    return "embedding" if row.key.name == "post_embedding" else "head"


def _ours(result: ValidationResult) -> dict[str, tuple[float | None, bool | None]]:
    """Place -> the worst margin and the verdict of our prefill checkpoints there."""
    found: dict[str, tuple[float | None, bool | None]] = {}
    for row in result.results:
        if row.step:
            continue
        place = _place(row)
        margin, passed = found.get(place, (None, None))
        margins = [m for m in (margin, row.margin) if m is not None]
        states = [p for p in (passed, row.state) if p is not None]
        found[place] = (max(margins) if margins else None, all(states) if states else None)
    return found


def _order(place: str) -> tuple[int, int]:
    if place == "embedding":
        return (0, 0)
    if place == "head":
        return (2, 0)
    return (1, int(place.split()[-1]))


def inspector_view(result: ValidationResult) -> list[InspectorRow] | None:
    """Our judgement and the Inspector's gap per place (None: the session has no Inspector record;
    an empty list where it failed)."""
    record = result.inspector
    if record is None:
        return None
    theirs = {str(p["place"]): p for p in record.get("places") or [] if isinstance(p, dict)}
    ours = _ours(result)
    rows = []
    for place in sorted(set(ours) | set(theirs), key=_order):
        margin, passed = ours.get(place, (None, None))
        got = theirs.get(place)
        rows.append(InspectorRow(place, margin, passed, None if got is None else int(got["operators"]),
                                 None if got is None else float(got["gap"]), None if got is None else str(got["operator"])))
    return rows if record.get("ran") else []


def _verdict(passed: bool | None) -> str:
    return "-" if passed is None else ("pass" if passed else "FAIL")


def _gap(gap: float | None) -> str:
    return "-" if gap is None else f"{gap:.3g}"


def inspector_text(result: ValidationResult) -> list[str]:
    """The terminal's lines: what the Inspector did (or why it failed), then per place our margin
    and verdict beside its worst gap (nothing without an Inspector record)."""
    rows = inspector_view(result)
    record = result.inspector
    if rows is None or record is None:
        return []
    lines = [f"inspector: {record.get('line')}"]
    lines += [f"inspector: {note}" for note in record.get("notes") or []]
    metric = record.get("metric")
    for r in rows:
        lines.append(f"  {r.place:<10} ours: margin {margin_text(r.margin, r.passed):>6} {_verdict(r.passed):<4}  "
                     f"Inspector: {metric} {_gap(r.gap)} over {r.operators or 0} operators"
                     + (f" (worst {r.operator})" if r.operator else ""))
    return lines


def inspector_section(result: ValidationResult) -> str:
    """The HTML section ``inspector`` (empty without an Inspector record): our worst margin and verdict
    per place beside the Inspector's operators and worst gap there, or why the Inspector failed."""
    rows = inspector_view(result)
    record = result.inspector
    if rows is None or record is None:
        return ""
    metric = esc(record.get("metric"))
    tool = esc(record.get("tool") or "the engine's own tool")
    parts = [f'<p id="inspector-line">{esc(record.get("line"))}</p>',
             *(f'<p class="note">{esc(note)}</p>' for note in record.get("notes") or []),
             '<p class="muted">Ours: the worst margin (error / bound, at most 1 passes) of the checkpoints at that '
             f"place against the float64 reference. {tool}: the engine's own gap per operator (against its own "
             "reference at its own precision), placed by the module the operator comes from; the worst of that "
             "place.</p>"]
    if rows:
        body = "".join(
            f'<tr><td>{esc(r.place)}</td><td class="num">{esc(margin_text(r.margin, r.passed))}</td>'
            f'<td class="{"fail" if r.passed is False else ""}">{esc(_verdict(r.passed))}</td>'
            f'<td class="num">{esc(r.operators if r.operators is not None else "-")}</td>'
            f'<td class="num">{esc(_gap(r.gap))}</td><td>{esc(r.operator or "-")}</td></tr>' for r in rows)
        parts.append(f"<table><thead><tr><th>place</th><th>our margin</th><th>our verdict</th><th>operators</th>"
                     f"<th>Inspector {metric}</th><th>worst operator</th></tr></thead><tbody>{body}</tbody></table>")
    return section("inspector", f"{tool} beside our judgement", "".join(parts))
