"""``ValidationReport``: a session's results as one document (JSON, HTML, CSV or JUnit XML).

The record is plain data read from the stores. Rendering lives in :mod:`debug_framework.reports`,
which this module never imports: ``generate_html_report``/``save_to_file`` call a
:class:`ReportRenderer` - the ``renderer=`` argument, else the record's ``renderer`` attribute, else
the process default in :data:`REPORT_RENDERER` (``debug_framework.reports.render_report``, installed
by the composition root in ``debug_framework/__init__.py``). The HTML page is self-contained
(verdict, error curves, checkpoint table with the first divergence marked, heatmap of the worst
checkpoint, environment, reproduce command); every value is HTML-escaped.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ..checkpoint_ids import row_checkpoint_id
from ..errors import DatabaseError, ValidationError
from ..jsonio import dumps_json
from ..storage.database import DatabaseLike, open_database
from ..storage.tensor_store import TensorStore
from ._common import REPORT_RENDERER_ROLE, Collaborator, format_time, now_utc, parse_time, write_report_file

__all__ = ["ValidationReport", "ReportRenderer", "REPORT_RENDERER", "REPORT_FORMATS", "summarize_checkpoints"]

#: The formats :meth:`ValidationReport.save_to_file` writes.
REPORT_FORMATS = ("json", "html", "csv", "junit")


class ReportRenderer(Protocol):
    """Renders a report as one document (``debug_framework.reports.render_report`` is one)."""

    def __call__(self, report: ValidationReport, fmt: str = "json", *, include_tensors: bool = False,
                 store: TensorStore | None = None) -> str: ...


#: The process default renderer (installed by the composition root, ``debug_framework/__init__.py``).
REPORT_RENDERER: Collaborator[ReportRenderer] = Collaborator(
    REPORT_RENDERER_ROLE, "pass renderer=debug_framework.reports.render_report")


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _ref(row: Mapping[str, Any], more: tuple[str, ...] = ()) -> dict[str, Any]:
    """A checkpoint row by reference: its canonical id, structured fields and max abs error (+ ``more``)."""
    keys = ("checkpoint", "layer", "step", "module", *more, "max_abs_error")
    return {"id": row_checkpoint_id(row), **{k: row.get(k) for k in keys}}


def summarize_checkpoints(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts, the first divergence (first failing row in model order) and the worst row (each with
    the checkpoint's canonical ``id`` beside ``checkpoint`` and ``layer``)."""
    failed = [r for r in rows if r.get("passed") is False or r.get("passed") == 0]
    passed = [r for r in rows if r.get("passed") is True or r.get("passed") == 1]

    def rank(r: Mapping[str, Any]) -> float:
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
class ValidationReport:
    report_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    overall_status: str
    checkpoint_results: list[dict[str, Any]] = field(default_factory=list)
    performance_metrics: dict[str, Any] = field(default_factory=dict)
    summary_statistics: dict[str, Any] = field(default_factory=dict)
    session: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)
    #: the session's tensor_recordings rows (metadata only; the bytes stay in the tensor store)
    tensor_recordings: list[dict[str, Any]] = field(default_factory=list)
    #: root of the tensor store beside the session's database (used for heatmaps / --include-tensors)
    tensor_store_root: str | None = field(default=None, repr=False, compare=False)
    #: renders this report (None: the process default, :data:`REPORT_RENDERER`)
    renderer: ReportRenderer | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_session(cls, session_id: str, db: DatabaseLike, *,
                     renderer: ReportRenderer | None = None) -> ValidationReport:
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
                   tensor_store_root=str(TensorStore.root_beside(database.source_path)), renderer=renderer)

    def to_dict(self) -> dict[str, Any]:
        return {
            "report_id": self.report_id, "session_id": self.session_id, "overall_status": self.overall_status,
            "summary_statistics": self.summary_statistics, "checkpoint_results": self.checkpoint_results,
            "performance_metrics": self.performance_metrics, "session": self.session,
            "tensor_recordings": self.tensor_recordings, "created_at": format_time(self.created_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ValidationReport:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["created_at"] = parse_time(kwargs.get("created_at")) or now_utc()
        return cls(**kwargs)

    def export_to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON (non-finite numbers written as the strings "NaN", "Infinity", "-Infinity")."""
        return dumps_json(self.to_dict(), indent=indent)

    def _renderer(self, renderer: ReportRenderer | None) -> ReportRenderer:
        return renderer or self.renderer or REPORT_RENDERER.get()

    def generate_html_report(self, *, include_tensors: bool = False, store: TensorStore | None = None,
                             renderer: ReportRenderer | None = None) -> str:
        """One self-contained HTML page (no scripts, no network); every value from the session is
        escaped. See :func:`debug_framework.reports.render_html`."""
        return self._renderer(renderer)(self, "html", include_tensors=include_tensors, store=store)

    def save_to_file(self, file_path: str | os.PathLike[str], format: str = "json", *,
                     include_tensors: bool = False, renderer: ReportRenderer | None = None) -> bool:
        """Write the report as ``json``, ``html``, ``csv`` or ``junit`` (atomically: temp file then rename),
        the same document :func:`debug_framework.reports.render_report` returns."""
        fmt = format.lower()
        if fmt not in REPORT_FORMATS:
            raise ValidationError(f"unknown report format {format!r}", hint="use 'json', 'html', 'csv' or 'junit'")
        text = self._renderer(renderer)(self, fmt, include_tensors=include_tensors)
        path = Path(file_path).expanduser()
        write_report_file(path, text)
        return True
