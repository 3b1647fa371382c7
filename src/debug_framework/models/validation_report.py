"""``ValidationReport``: a session's results as one document (JSON or a simple HTML page).

The full HTML report (error curves, heatmap) belongs to ``debug_framework.reports``; the page
here is deliberately plain: verdict, summary, the checkpoint table with the first divergence
marked, performance and environment. Every value is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import math
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import DatabaseError, ValidationError
from ._common import format_time, json_safe, now_utc, parse_time, resolve_db

__all__ = ["ValidationReport", "summarize_checkpoints"]

_TABLE_METRICS = ("max_abs_error", "mean_abs_error", "max_rel_error", "rel_l2_error", "cosine_similarity",
                  "sqnr_db", "mismatch_percent", "max_ulp_error")


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
        return cls(session_id=session_id, overall_status=row["status"], checkpoint_results=rows,
                   performance_metrics=dict(perf or {}), summary_statistics=summarize_checkpoints(rows),
                   session=row)

    def to_dict(self) -> dict[str, Any]:
        return {
            "report_id": self.report_id, "session_id": self.session_id, "overall_status": self.overall_status,
            "summary_statistics": self.summary_statistics, "checkpoint_results": self.checkpoint_results,
            "performance_metrics": self.performance_metrics, "session": self.session,
            "created_at": format_time(self.created_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ValidationReport:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["created_at"] = parse_time(kwargs.get("created_at")) or now_utc()
        return cls(**kwargs)

    def export_to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON (non-finite numbers written as the strings "NaN", "Infinity", "-Infinity")."""
        return json.dumps(json_safe(self.to_dict()), indent=indent, sort_keys=True, allow_nan=False,
                          default=str)

    def generate_html_report(self) -> str:
        """One self-contained HTML page; every value from the session is escaped."""
        e = lambda v: html.escape("" if v is None else str(v), quote=True)  # noqa: E731
        s = self.summary_statistics or summarize_checkpoints(self.checkpoint_results)
        first = s.get("first_divergence") or {}
        sess = self.session or {}
        rows_html = []
        for r in self.checkpoint_results:
            is_first = bool(first) and r.get("checkpoint") == first.get("checkpoint") and r.get("layer") == first.get("layer")
            verdict = "pass" if r.get("passed") in (True, 1) else ("FAIL" if r.get("passed") in (False, 0) else "?")
            cells = "".join(f"<td>{e(r.get(m))}</td>" for m in _TABLE_METRICS)
            cls_ = ' class="first"' if is_first else (' class="fail"' if verdict == "FAIL" else "")
            mark = " &larr; first divergence" if is_first else ""
            rows_html.append(f"<tr{cls_}><td>{e(r.get('checkpoint'))}</td><td>{e(r.get('layer'))}</td>"
                             f"<td>{e(verdict)}{mark}</td>{cells}<td>{e(r.get('reason'))}</td></tr>")
        head = "".join(f"<th>{e(m)}</th>" for m in _TABLE_METRICS)
        kv = lambda d: "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in sorted((d or {}).items()))  # noqa: E731
        first_text = ("none: every checkpoint within tolerance" if not first
                      else f"{first.get('checkpoint')} layer {first.get('layer')} (max abs error {first.get('max_abs_error')})")
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Validation report {e(self.session_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}
tr.fail td{{background:#fee}}tr.first td{{background:#fbb;font-weight:bold}}.verdict{{font-size:1.4em}}</style></head>
<body><h1>Validation report</h1>
<p class="verdict">Verdict: <strong>{e(self.overall_status)}</strong></p>
<table><tr><th>session</th><td>{e(self.session_id)}</td></tr><tr><th>model</th><td>{e(sess.get('model_path'))}</td></tr>
<tr><th>weights digest</th><td>{e(sess.get('weights_digest'))}</td></tr>
<tr><th>reference backend</th><td>{e(sess.get('reference_backend'))}</td></tr>
<tr><th>alternative backend</th><td>{e(sess.get('alternative_backend'))}</td></tr>
<tr><th>first divergence</th><td>{e(first_text)}</td></tr>
<tr><th>checkpoints</th><td>{e(s.get('checkpoints'))} ({e(s.get('passed'))} passed, {e(s.get('failed'))} failed)</td></tr></table>
<h2>Checkpoints</h2>
<table><tr><th>checkpoint</th><th>layer</th><th>verdict</th>{head}<th>reason</th></tr>
{''.join(rows_html)}</table>
<h2>Performance</h2><table>{kv(self.performance_metrics)}</table>
<h2>Environment</h2><table>{kv(sess.get('environment'))}</table>
<p>Report {e(self.report_id)} generated {e(format_time(self.created_at))}</p>
</body></html>
"""

    def save_to_file(self, file_path: str | os.PathLike[str], format: str = "json") -> bool:
        """Write the report as ``json`` or ``html`` (atomically: temp file then rename)."""
        fmt = format.lower()
        if fmt == "json":
            text = self.export_to_json()
        elif fmt == "html":
            text = self.generate_html_report()
        else:
            raise ValidationError(f"unknown report format {format!r}", hint="use 'json' or 'html'")
        path = Path(file_path).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            raise DatabaseError(f"cannot write the report: {exc}", file=str(path),
                                hint="choose a writable output path") from exc
        return True
