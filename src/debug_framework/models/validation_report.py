"""``ValidationReport``: a session's results as one document (JSON, HTML, CSV or JUnit XML).

The renderers live in :mod:`debug_framework.reports`; ``generate_html_report`` returns the full
self-contained page (verdict, error curves, checkpoint table with the first divergence marked,
heatmap of the worst checkpoint, environment, reproduce command). Every value is HTML-escaped.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import DatabaseError, ValidationError
from ..comparison import dumps_json
from ._common import format_time, now_utc, parse_time, resolve_db, write_text_atomic

__all__ = ["ValidationReport", "summarize_checkpoints"]


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def summarize_checkpoints(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts, the first divergence (first failing row in model order) and the worst row."""
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
        "first_divergence": None if first is None else {
            "checkpoint": first.get("checkpoint"), "layer": first.get("layer"),
            "max_abs_error": first.get("max_abs_error"), "reason": first.get("reason")},
        "worst": None if worst is None else {
            "checkpoint": worst.get("checkpoint"), "layer": worst.get("layer"),
            "max_abs_error": worst.get("max_abs_error")},
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

    @classmethod
    def from_session(cls, session_id: str, db: Any) -> ValidationReport:
        """Build the report of a stored session (status, every checkpoint row, summary)."""
        manager = resolve_db(db)
        row = manager.get_session(session_id)
        if row is None:
            raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                hint="list sessions with session_report --list")
        rows = manager.get_checkpoint_results(session_id)
        results = row.get("results") or {}
        perf = results.get("performance") if isinstance(results, dict) else None
        recordings = manager.get_tensor_recordings(session_id)
        from ..services.tensor_store import TensorStore

        return cls(session_id=session_id, overall_status=row["status"], checkpoint_results=rows,
                   performance_metrics=dict(perf) if isinstance(perf, dict) else {},
                   summary_statistics=summarize_checkpoints(rows), session=row, tensor_recordings=recordings,
                   tensor_store_root=str(TensorStore.root_beside(manager.database_path)))

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

    def generate_html_report(self, *, include_tensors: bool = False, store: Any = None) -> str:
        """One self-contained HTML page (no scripts, no network); every value from the session is
        escaped. See :func:`debug_framework.reports.render_html`."""
        from ..reports.html_report import render_html

        return render_html(self, include_tensors=include_tensors, store=store)

    def save_to_file(self, file_path: str | os.PathLike[str], format: str = "json", *,
                     include_tensors: bool = False) -> bool:
        """Write the report as ``json``, ``html``, ``csv`` or ``junit`` (atomically: temp file then rename),
        the same document :func:`debug_framework.reports.render_report` returns."""
        fmt = format.lower()
        if fmt not in ("json", "html", "csv", "junit"):
            raise ValidationError(f"unknown report format {format!r}", hint="use 'json', 'html', 'csv' or 'junit'")
        from ..reports import render_report

        text = render_report(self, fmt, include_tensors=include_tensors)
        path = Path(file_path).expanduser()
        try:
            write_text_atomic(path, text)
        except OSError as exc:
            raise ValidationError(f"cannot write the report: {exc}", file=str(path),
                                  hint="choose a writable output path") from exc
        return True
