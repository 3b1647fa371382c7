"""The report formats: the one list every writer of a stored session's report checks against.

``session_report --output-format``, ``ValidationReport.save_to_file`` (:mod:`debug_framework.compat`)
and :func:`debug_framework.reports.render_report` all import these tuples; nothing spells them again.
"""

from __future__ import annotations

__all__ = ["REPORT_FORMATS", "DIFF_FORMATS", "MEDIA"]

#: A session's report: strict JSON, one self-contained HTML page, CSV (one row per checkpoint), JUnit XML.
REPORT_FORMATS: tuple[str, ...] = ("json", "html", "csv", "junit")
#: A two-session diff: the formats a diff is written in (JUnit has no place for a change).
DIFF_FORMATS: tuple[str, ...] = ("json", "html", "csv")
#: Each report format's media type and file suffix (the dashboard's download buttons name files by them).
MEDIA: dict[str, tuple[str, str]] = {"json": ("application/json", "json"), "html": ("text/html", "html"),
                                     "csv": ("text/csv", "csv"), "junit": ("application/xml", "xml")}
