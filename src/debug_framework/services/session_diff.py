"""Diff two sessions of the same model and backends: which ``(checkpoint, layer, step)`` got better or worse.

Rows are matched by checkpoint, layer and decode ``step`` (None for a session that does not decode;
0 the prefill), so two decode sessions compare step by step.

A key is **worse** when it went from pass to fail, or its max abs error grew by more than the
larger of ``rel_change`` (relative), ``abs_floor`` and ``atol_fraction`` of the checkpoint's
absolute tolerance (so 3.2e-8 -> 3.8e-8 under an atol of 1e-5 is noise, not a regression);
**better** the other way round; **unchanged** otherwise; **new**/**missing** when only the
second/first session has it. NaN error ranks worst.

What else differs between the sessions (weights digest, backend versions, tolerances) is listed
leaf by leaf in ``differences`` (``alternative_backend_info.torch: '2.13.0' -> '2.14.0'``), and as
sentences in ``notes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..checkpoint_ids import checkpoint_id
from ..errors import ConfigurationError, DatabaseError
from ..jsonio import JsonObject, JsonValue, dumps_json
from ..storage.database import DatabaseLike, open_database

if TYPE_CHECKING:
    from .validation.results import CheckpointResult

__all__ = ["CheckpointChange", "FieldDifference", "SessionDiff", "diff_sessions", "value_text", "DIFF_OPTIONS"]

#: The keyword arguments of :func:`diff_sessions` a caller may spell its own way in messages
#: (a CLI passes its flags: ``{"rel_change": "--rel-change", ...}``).
DIFF_OPTIONS = ("rel_change", "abs_floor", "atol_fraction", "require_same_model")
_MISSING = "(not recorded)"
_MAX_VALUE_TEXT = 80


@dataclass(frozen=True)
class FieldDifference:
    """One leaf that differs between the sessions: ``field`` (``alternative_backend_info.torch``)."""

    field: str
    before: JsonValue
    after: JsonValue

    def to_dict(self) -> JsonObject:
        return {"field": self.field, "before": self.before, "after": self.after}

    def sentence(self) -> str:
        return f"{self.field}: {value_text(self.before)} -> {value_text(self.after)}"


def value_text(value: JsonValue, limit: int = _MAX_VALUE_TEXT) -> str:
    """A difference's value in one short line: strings as they are, None as ``(not recorded)``,
    anything else as compact JSON; cut to ``limit`` characters."""
    if value is None:
        text = _MISSING
    elif isinstance(value, str):
        text = value
    else:
        text = dumps_json(value, indent=None)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _leaf_differences(name: str, a: JsonValue, b: JsonValue, depth: int = 0) -> list[FieldDifference]:
    """The leaves of two JSON values that differ, dotted paths from ``name`` (dicts recursed; a key
    only one side has is None on the other)."""
    if a == b:
        return []
    if isinstance(a, (dict, type(None))) and isinstance(b, (dict, type(None))) and depth < 8:
        a, b = a or {}, b or {}  # a dict on one side only: its leaves, each against "not recorded"
        out: list[FieldDifference] = []
        for key in sorted(set(a) | set(b), key=str):
            out += _leaf_differences(f"{name}.{key}", a.get(key), b.get(key), depth + 1)
        return out
    return [FieldDifference(name, a, b)]


@dataclass(frozen=True)
class CheckpointChange:
    """How one checkpoint changed between the sessions; ``id`` is its canonical id (``post_mlp:1``;
    a decode step adds ``@step``: ``post_mlp:1@2``)."""

    checkpoint: str
    layer: int | None
    step: int | None  # the decode pass (0: the prefill); None for a session that does not decode
    change: str  # better | worse | unchanged | new | missing
    before_max_abs_error: float | None
    after_max_abs_error: float | None
    before_passed: bool | None
    after_passed: bool | None

    @property
    def id(self) -> str:
        return checkpoint_id(self.checkpoint, self.layer, self.step)

    def to_dict(self) -> JsonObject:
        """``{"id", "checkpoint", "layer", "step", "change", ...}``."""
        return {"id": self.id, **self.__dict__}


@dataclass
class SessionDiff:
    before_session_id: str
    after_session_id: str
    changes: list[CheckpointChange]
    notes: list[str] = field(default_factory=list)
    #: what else differs between the sessions, leaf by leaf (``notes`` says the same in sentences)
    differences: list[FieldDifference] = field(default_factory=list)

    def by_change(self, change: str) -> list[CheckpointChange]:
        return [c for c in self.changes if c.change == change]

    @property
    def better(self) -> list[CheckpointChange]:
        return self.by_change("better")

    @property
    def worse(self) -> list[CheckpointChange]:
        return self.by_change("worse")

    @property
    def new(self) -> list[CheckpointChange]:
        return self.by_change("new")

    @property
    def missing(self) -> list[CheckpointChange]:
        return self.by_change("missing")

    @property
    def counts(self) -> dict[str, int]:
        """How many checkpoints got better, worse, stayed, are new or missing."""
        return {k: len(self.by_change(k)) for k in ("better", "worse", "unchanged", "new", "missing")}

    def to_dict(self) -> JsonObject:
        counts = self.counts
        return {"before_session_id": self.before_session_id, "after_session_id": self.after_session_id,
                "counts": counts, "notes": list(self.notes),
                "differences": [d.to_dict() for d in self.differences],
                "changes": [c.to_dict() for c in self.changes]}


def _err(row: CheckpointResult) -> float:
    """A checkpoint's max abs error (NaN where it has none)."""
    value = row.comparison.max_abs_error
    return math.nan if value is None else float(value)


def _atol(row: CheckpointResult) -> float:
    """The absolute tolerance the row was judged by (0 when none judged it)."""
    f = 0.0 if row.tolerance is None else float(row.tolerance.atol)
    return f if math.isfinite(f) and f > 0 else 0.0


def _compare(before: CheckpointResult, after: CheckpointResult, rel_change: float, abs_floor: float,
             atol_fraction: float = 0.0) -> str:
    pb, pa = before.state, after.state
    if pb is True and pa is False:
        return "worse"
    if pb is False and pa is True:
        return "better"
    eb, ea = _err(before), _err(after)
    if math.isnan(eb) and math.isnan(ea):
        return "unchanged"
    if math.isnan(ea):
        return "worse"
    if math.isnan(eb):
        return "better"
    floor = max(abs_floor, atol_fraction * max(_atol(before), _atol(after)))
    threshold = max(floor, rel_change * max(abs(eb), abs(ea)))
    if ea - eb > threshold:
        return "worse"
    if eb - ea > threshold:
        return "better"
    return "unchanged"


def _spell(name: str, value: str | None, flags: Mapping[str, str] | None) -> str:
    """How a message names option ``name`` (set to ``value``): the caller's flag, else the keyword."""
    if flags and name in flags:
        return flags[name] if value is None or name == "require_same_model" else f"{flags[name]} {value}"
    return name if value is None else f"{name}={value}"


def _check_thresholds(values: Mapping[str, float], flags: Mapping[str, str] | None) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigurationError(f"{_spell(name, None, flags)} must be a finite number >= 0, got {value!r}",
                                     hint=f"e.g. {_spell('rel_change', '0.10', flags)} (10 %), "
                                          f"{_spell('abs_floor', '0', flags)}, {_spell('atol_fraction', '0.1', flags)}")


def _key(row: CheckpointResult) -> tuple[str, int | None, int | None]:
    """Where a checkpoint sits: ``(checkpoint, layer, step)``."""
    return row.key.name, row.key.layer, row.step


def diff_sessions(
    before_session_id: str,
    after_session_id: str,
    db: DatabaseLike,
    *,
    rel_change: float = 0.10,
    abs_floor: float = 0.0,
    atol_fraction: float = 0.1,
    require_same_model: bool = True,
    option_names: Mapping[str, str] | None = None,
) -> SessionDiff:
    """Compare two stored sessions key by key (``db``: a Database or a database path).

    A change of a checkpoint's max abs error counts when it exceeds the largest of ``abs_floor``,
    ``atol_fraction`` times the checkpoint's absolute tolerance, and ``rel_change`` times the larger
    error. ``option_names`` maps keywords of :data:`DIFF_OPTIONS` to the names the caller's users
    know (a CLI's flags), used in error messages.

    Raises DatabaseError (DF003, as for every unknown session id) when a session is missing;
    ConfigurationError (DF005) when ``rel_change``/``abs_floor``/``atol_fraction`` is negative or not finite,
    or, with ``require_same_model``, when the model path or the backend names differ. Different
    weight digests, backend versions or tolerances are listed in ``differences``/``notes`` (that is
    usually what is being compared).
    """
    _check_thresholds({"rel_change": rel_change, "abs_floor": abs_floor, "atol_fraction": atol_fraction},
                      option_names)
    database = open_database(db)
    a, b = database.sessions.get(before_session_id), database.sessions.get(after_session_id)
    for sid, row in ((before_session_id, a), (after_session_id, b)):
        if row is None:
            raise DatabaseError(f"session {sid!r} does not exist", session=sid,
                                  hint="list sessions with session_report --list")
    assert a is not None and b is not None
    differences: list[FieldDifference] = []
    for key in ("model_path", "reference_backend", "alternative_backend"):
        if a[key] != b[key]:
            if require_same_model:
                raise ConfigurationError(
                    f"sessions are not comparable: {key} differs: {a[key]!r} vs {b[key]!r}",
                    hint=f"diff sessions of the same model and backends, or pass "
                         f"{_spell('require_same_model', 'False', option_names)}")
            differences.append(FieldDifference(key, a[key], b[key]))
    for key in ("weights_digest", "reference_backend_info", "alternative_backend_info", "tolerances"):
        differences += _leaf_differences(key, a.get(key), b.get(key))
    notes = [d.sentence() for d in differences]
    from .validation.results import ValidationResult  # the typed result each session stored

    rows_a = {_key(r): r for r in ValidationResult.from_stored(a, database.checkpoints.for_session(before_session_id)).results}
    rows_b = {_key(r): r for r in ValidationResult.from_stored(b, database.checkpoints.for_session(after_session_id)).results}
    changes: list[CheckpointChange] = []
    order = list(rows_a) + [k for k in rows_b if k not in rows_a]
    for key in order:
        ra, rb = rows_a.get(key), rows_b.get(key)
        if ra is None:
            kind = "new"
        elif rb is None:
            kind = "missing"
        else:
            kind = _compare(ra, rb, rel_change, abs_floor, atol_fraction)
        changes.append(CheckpointChange(
            checkpoint=key[0], layer=key[1], step=key[2], change=kind,
            before_max_abs_error=None if ra is None else ra.comparison.max_abs_error,
            after_max_abs_error=None if rb is None else rb.comparison.max_abs_error,
            before_passed=None if ra is None else ra.state,
            after_passed=None if rb is None else rb.state,
        ))
    return SessionDiff(before_session_id, after_session_id, changes, notes, differences)
