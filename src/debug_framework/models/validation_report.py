"""``ValidationReport``: a session's results as one document (JSON, HTML, CSV or JUnit XML).

The record is plain data read from the stores (:meth:`ValidationReport.from_session`). Rendering
lives in :mod:`debug_framework.reports`, which this module never imports: the project renders with
``reports.render_report(report, fmt)`` and writes with ``models._common.write_report_file``. The
spec's ``generate_html_report``, ``export_to_json`` and ``save_to_file`` are faces over them,
inherited from :class:`debug_framework.compat.ReportFaces`.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..checkpoint_ids import row_checkpoint_id
from ..compat import ReportFaces
from ..errors import DatabaseError
from ..jsonio import JsonObject
from ..storage.database import DatabaseLike, open_database
from ..storage.tensor_store import TensorStore
from ._common import format_time, now_utc, parse_time

__all__ = ["ValidationReport", "summarize_checkpoints"]


def _num(v: object) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _ref(row: Mapping[str, object], more: tuple[str, ...] = ()) -> JsonObject:
    """A checkpoint row by reference: its canonical id, structured fields and max abs error (+ ``more``)."""
    keys = ("checkpoint", "layer", "step", "module", *more, "max_abs_error")
    return {"id": row_checkpoint_id(row), **{k: row.get(k) for k in keys}}


def summarize_checkpoints(rows: list[Mapping[str, object]]) -> JsonObject:
    """Counts, the first divergence (first failing row in model order) and the worst row (each with
    the checkpoint's canonical ``id`` beside ``checkpoint`` and ``layer``)."""
    failed = [r for r in rows if r.get("passed") is False or r.get("passed") == 0]
    passed = [r for r in rows if r.get("passed") is True or r.get("passed") == 1]

    def rank(r: Mapping[str, object]) -> float:
        v = _num(r.get("max_abs_error"))
        return -math.inf if v is None else (math.inf if math.isnan(v) else v)

    worst = max(rows, key=rank) if rows else None
    first = failed[0] if failed else None
    return {
        "checkpoints": len(rows),
        "passed": len(passed),
        "failed": len(failed),
        "unknown": len(rows) - len(passed) - len(failed),
        "first_divergence": None if first is None else _ref(first, ("judged_by", "bound", "margin", "reason")),
        "worst": None if worst is None else _ref(worst),
    }


@dataclass(kw_only=True)
class ValidationReport(ReportFaces):
    report_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    overall_status: str
    checkpoint_results: list[JsonObject] = field(default_factory=list)
    performance_metrics: JsonObject = field(default_factory=dict)
    summary_statistics: JsonObject = field(default_factory=dict)
    session: JsonObject = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)
    #: the session's tensor_recordings rows (metadata only; the bytes stay in the tensor store)
    tensor_recordings: list[JsonObject] = field(default_factory=list)
    #: root of the tensor store beside the session's database (used for heatmaps / --include-tensors)
    tensor_store_root: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_session(cls, session_id: str, db: DatabaseLike) -> ValidationReport:
        """Build the report of a stored session (status, every checkpoint row, summary)."""
        database = open_database(db)
        row = database.sessions.get(session_id)
        if row is None:
            raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                hint="list sessions with session_report --list")
        rows = database.checkpoints.for_session(session_id)
        results = row.get("results") or {}
        perf = results.get("performance") if isinstance(results, dict) else None
        return cls(session_id=session_id, overall_status=row["status"], checkpoint_results=rows,
                   performance_metrics=dict(perf) if isinstance(perf, dict) else {},
                   summary_statistics=summarize_checkpoints(rows), session=row,
                   tensor_recordings=database.recordings.for_session(session_id),
                   tensor_store_root=str(TensorStore.root_beside(database.source_path)))

    def to_dict(self) -> JsonObject:
        return {
            "report_id": self.report_id, "session_id": self.session_id, "overall_status": self.overall_status,
            "summary_statistics": self.summary_statistics, "checkpoint_results": self.checkpoint_results,
            "performance_metrics": self.performance_metrics, "session": self.session,
            "tensor_recordings": self.tensor_recordings, "created_at": format_time(self.created_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ValidationReport:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["created_at"] = parse_time(kwargs.get("created_at")) or now_utc()
        return cls(**kwargs)
