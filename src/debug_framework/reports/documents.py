"""What the renderers read: plain documents, described structurally.

The renderers import neither the records (:mod:`debug_framework.models`) nor the services; they
render anything with these attributes. ``ValidationReport`` (models) is a :class:`ReportSource`
and ``SessionDiff`` (services.session_diff) a :class:`DiffSource`; :func:`session_side` builds the
little a diff page shows of each session straight from the stores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from ..errors import DatabaseError
from ..jsonio import JsonObject
from ..storage.database import DatabaseLike, open_database
from ..storage.session_record import SessionRecord
from ._common import verdict_of

if TYPE_CHECKING:
    from ..services.validation.results import CheckpointResult, ValidationResult

__all__ = ["SessionSource", "ReportSource", "ChangeSource", "DiffSource", "SessionSide", "session_side", "Stored",
           "stored"]


class SessionSource(Protocol):
    """A stored session as the diff page shows it."""

    @property
    def session_id(self) -> str: ...
    @property
    def overall_status(self) -> str: ...
    @property
    def session(self) -> JsonObject: ...
    @property
    def checkpoint_results(self) -> list[JsonObject]: ...


class ReportSource(SessionSource, Protocol):
    """Everything stored about one session (``ValidationReport`` fields)."""

    @property
    def report_id(self) -> str: ...
    @property
    def performance_metrics(self) -> JsonObject: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def tensor_recordings(self) -> list[JsonObject]: ...
    @property
    def tensor_store_root(self) -> str | None: ...

    def to_dict(self) -> JsonObject: ...


class ChangeSource(Protocol):
    """How one ``(checkpoint, layer, step)`` changed between two sessions (``id``: its canonical id)."""

    @property
    def id(self) -> str: ...
    @property
    def checkpoint(self) -> str: ...
    @property
    def layer(self) -> int | None: ...
    @property
    def step(self) -> int | None: ...
    @property
    def change(self) -> str: ...
    @property
    def before_max_abs_error(self) -> float | None: ...
    @property
    def after_max_abs_error(self) -> float | None: ...
    @property
    def before_passed(self) -> bool | None: ...
    @property
    def after_passed(self) -> bool | None: ...


class DiffSource(Protocol):
    """A diff of two sessions (``SessionDiff`` fields)."""

    @property
    def before_session_id(self) -> str: ...
    @property
    def after_session_id(self) -> str: ...
    @property
    def changes(self) -> Sequence[ChangeSource]: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def counts(self) -> Mapping[str, int]: ...

    def to_dict(self) -> JsonObject: ...


@dataclass(frozen=True)
class SessionSide:
    """A :class:`SessionSource` read from the stores."""

    session_id: str
    overall_status: str
    session: JsonObject
    #: the session's checkpoint rows (model order): the diff chart draws the bounds they were judged by
    checkpoint_results: list[JsonObject] = field(default_factory=list)


def session_side(session_id: str, db: DatabaseLike) -> SessionSide:
    """The stored session ``session_id``; DatabaseError (DF003) when there is none."""
    database = open_database(db)
    row = database.sessions.get(session_id)
    if row is None:
        raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                            hint="list sessions with session_report --list")
    return SessionSide(session_id=session_id, overall_status=row["status"], session=row,
                       checkpoint_results=database.checkpoints.for_session(session_id))


@dataclass(frozen=True)
class Stored:
    """What every view renders of a stored session: its row as a :class:`SessionRecord` and what it
    measured as the typed :class:`~debug_framework.services.validation.results.ValidationResult`
    (:meth:`ValidationResult.from_stored`); ``status`` is the report's overall status."""

    record: SessionRecord
    result: ValidationResult
    status: str

    @property
    def rows(self) -> list[CheckpointResult]:
        """The checkpoint results in model order."""
        return self.result.results

    @property
    def verdict(self) -> str:
        """The verdict the run stored, else the session's status (a run that stored none)."""
        return verdict_of(replace(self.record, status=self.status))

    @property
    def first_divergence(self) -> CheckpointResult | None:
        """The first checkpoint (model order) that failed: the run's first divergence."""
        return self.result.first_divergence


def stored(report: ReportSource | SessionSide) -> Stored:
    """The typed :class:`Stored` of a report's session row and checkpoint rows."""
    from ..services.validation.results import ValidationResult

    row = {"session_id": report.session_id, **(report.session or {})}
    record = SessionRecord.from_row(row)
    return Stored(record, ValidationResult.from_stored(row, report.checkpoint_results),
                  str(report.overall_status or record.status))
