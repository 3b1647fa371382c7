"""Diff two sessions of the same model and backends: which ``(checkpoint, layer)`` got better or worse.

A key is **worse** when it went from pass to fail, or its max abs error grew by more than
``rel_change`` (relative) and ``abs_floor``; **better** the other way round; **unchanged**
otherwise; **new**/**missing** when only the second/first session has it. NaN error ranks worst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatabaseError, ValidationError
from ..storage.database import DatabaseLike, open_database

__all__ = ["CheckpointChange", "SessionDiff", "diff_sessions"]


@dataclass(frozen=True)
class CheckpointChange:
    checkpoint: str
    layer: int | None
    change: str  # better | worse | unchanged | new | missing
    before_max_abs_error: float | None
    after_max_abs_error: float | None
    before_passed: bool | None
    after_passed: bool | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SessionDiff:
    before_session_id: str
    after_session_id: str
    changes: list[CheckpointChange]
    notes: list[str] = field(default_factory=list)

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

    def to_dict(self) -> dict[str, Any]:
        counts = {k: len(self.by_change(k)) for k in ("better", "worse", "unchanged", "new", "missing")}
        return {"before_session_id": self.before_session_id, "after_session_id": self.after_session_id,
                "counts": counts, "notes": list(self.notes), "changes": [c.to_dict() for c in self.changes]}


def _err(v: Any) -> float:
    if v is None:
        return math.nan
    return float(v)


def _passed(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _compare(before: dict[str, Any], after: dict[str, Any], rel_change: float, abs_floor: float) -> str:
    pb, pa = _passed(before.get("passed")), _passed(after.get("passed"))
    if pb is True and pa is False:
        return "worse"
    if pb is False and pa is True:
        return "better"
    eb, ea = _err(before.get("max_abs_error")), _err(after.get("max_abs_error"))
    if math.isnan(eb) and math.isnan(ea):
        return "unchanged"
    if math.isnan(ea):
        return "worse"
    if math.isnan(eb):
        return "better"
    threshold = max(abs_floor, rel_change * max(abs(eb), abs(ea)))
    if ea - eb > threshold:
        return "worse"
    if eb - ea > threshold:
        return "better"
    return "unchanged"


def diff_sessions(
    before_session_id: str,
    after_session_id: str,
    db: DatabaseLike,
    *,
    rel_change: float = 0.10,
    abs_floor: float = 0.0,
    require_same_model: bool = True,
) -> SessionDiff:
    """Compare two stored sessions key by key (``db``: a DatabaseManager or a database path).

    Raises DatabaseError (DF003, as for every unknown session id) when a session is missing;
    ValidationError when ``rel_change``/``abs_floor`` is negative or
    not finite, or, with ``require_same_model``, when the model path or the backend names differ. Different weight digests or backend versions are
    reported in ``notes`` (that is usually what is being compared).
    """
    for name, value in (("rel_change", rel_change), ("abs_floor", abs_floor)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValidationError(f"{name} must be a finite number >= 0, got {value!r}",
                                  hint="e.g. rel_change=0.10 (10 %), abs_floor=0")
    database = open_database(db)
    a, b = database.sessions.get(before_session_id), database.sessions.get(after_session_id)
    for sid, row in ((before_session_id, a), (after_session_id, b)):
        if row is None:
            raise DatabaseError(f"session {sid!r} does not exist", session=sid,
                                  hint="list sessions with session_report --list")
    assert a is not None and b is not None
    notes: list[str] = []
    for key in ("model_path", "reference_backend", "alternative_backend"):
        if a[key] != b[key]:
            msg = f"{key} differs: {a[key]!r} vs {b[key]!r}"
            if require_same_model:
                raise ValidationError(f"sessions are not comparable: {msg}",
                                      hint="diff sessions of the same model and backends, or pass require_same_model=False")
            notes.append(msg)
    for key in ("weights_digest", "reference_backend_info", "alternative_backend_info", "tolerances"):
        if a.get(key) != b.get(key):
            notes.append(f"{key} differs: {a.get(key)!r} vs {b.get(key)!r}")
    rows_a = {(r["checkpoint"], r["layer"]): r for r in database.checkpoints.for_session(before_session_id)}
    rows_b = {(r["checkpoint"], r["layer"]): r for r in database.checkpoints.for_session(after_session_id)}
    changes: list[CheckpointChange] = []
    order = list(rows_a) + [k for k in rows_b if k not in rows_a]
    for key in order:
        ra, rb = rows_a.get(key), rows_b.get(key)
        if ra is None:
            kind = "new"
        elif rb is None:
            kind = "missing"
        else:
            kind = _compare(ra, rb, rel_change, abs_floor)
        changes.append(CheckpointChange(
            checkpoint=key[0], layer=key[1], change=kind,
            before_max_abs_error=None if ra is None else ra.get("max_abs_error"),
            after_max_abs_error=None if rb is None else rb.get("max_abs_error"),
            before_passed=None if ra is None else _passed(ra.get("passed")),
            after_passed=None if rb is None else _passed(rb.get("passed")),
        ))
    return SessionDiff(before_session_id, after_session_id, changes, notes)
