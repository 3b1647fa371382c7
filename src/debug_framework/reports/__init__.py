"""Reports of stored validation sessions: JSON, HTML, CSV and JUnit XML, plus a two-session diff.

    from debug_framework.models.validation_report import ValidationReport
    from debug_framework.reports import render_report

    report = ValidationReport.from_session(session_id, db)     # db: a Database or a path
    html = render_report(report, "html")                       # one self-contained page
    xml = render_report(report, "junit")

Renderers read only what the store holds (a :class:`~.documents.ReportSource` such as
``ValidationReport``: session row, checkpoint rows, recordings) and, for heatmaps /
``include_tensors``, the tensor store beside the database. They import neither the records nor
the services (see :mod:`.documents`). See ``docs/reports.md``.
"""

from __future__ import annotations

from ..errors import ConfigurationError
from ..storage.database import DatabaseLike
from ..storage.tensor_store import TensorStore
from ..report_formats import DIFF_FORMATS, REPORT_FORMATS
from .csv_report import CSV_COLUMNS, render_csv, render_diff_csv
from ._html import CSP, neutralise_bidi
from .documents import DiffSource, ReportSource, SessionSource, session_side
from .html_report import render_diff_html, render_html
from .json_report import render_diff_json, render_json, report_document
from .junit_report import render_junit

__all__ = [
    "FORMATS",
    "REPORT_FORMATS",
    "DIFF_FORMATS",
    "CSV_COLUMNS",
    "render_report",
    "render_diff",
    "render_json",
    "render_html",
    "render_csv",
    "render_junit",
    "render_diff_json",
    "render_diff_html",
    "render_diff_csv",
    "report_document",
    "ReportSource",
    "SessionSource",
    "DiffSource",
    "CSP",
    "neutralise_bidi",
]

#: the report formats (:data:`debug_framework.report_formats.REPORT_FORMATS`; ``FORMATS`` is its older name)
FORMATS = REPORT_FORMATS


def render_report(report: ReportSource, fmt: str = "json", *, include_tensors: bool = False,
                  store: TensorStore | None = None) -> str:
    """Render ``report`` as ``json``, ``html``, ``csv`` or ``junit`` (JUnit XML).

    ``include_tensors`` adds the recorded tensors (statistics and values) to JSON and HTML; CSV and
    JUnit carry one row/testcase per checkpoint and ignore it.
    """
    f = fmt.lower()
    if f == "json":
        return render_json(report, include_tensors=include_tensors, store=store)
    if f == "html":
        return render_html(report, include_tensors=include_tensors, store=store)
    if f == "csv":
        return render_csv(report)
    if f in ("junit", "xml"):
        return render_junit(report)
    raise ConfigurationError(f"unknown report format {fmt!r}", hint=f"use one of {', '.join(REPORT_FORMATS)}")


def render_diff(diff: DiffSource, fmt: str = "json", *, before: SessionSource | None = None,
                after: SessionSource | None = None, db: DatabaseLike | None = None) -> str:
    """Render a :class:`~debug_framework.services.session_diff.SessionDiff` as json, html or csv.

    HTML shows both sessions' summaries; pass their reports, or ``db`` to read the sessions.
    """
    f = fmt.lower()
    if f == "json":
        return render_diff_json(diff)
    if f == "csv":
        return render_diff_csv(diff)
    if f == "html":
        if before is None or after is None:
            if db is None:
                raise ConfigurationError("the HTML diff needs both sessions", hint="pass before=/after= reports or db=")
            before = before or session_side(diff.before_session_id, db)
            after = after or session_side(diff.after_session_id, db)
        return render_diff_html(diff, before, after)
    raise ConfigurationError(f"unknown diff format {fmt!r}", hint=f"use one of {', '.join(DIFF_FORMATS)}")
