"""JUnit XML report: one ``<testcase>`` per checkpoint, named by its id (``post_attention:1``), so a
CI shows which failed.

``<testsuites>`` holds one ``<testsuite name="validation <model>">`` with ``tests``, ``failures``,
``errors``, ``skipped`` and ``time`` (session wall time when known), ``<properties>`` with the
session id, model, backends, status, verdict and first divergence (its id). A failing checkpoint has a
``<failure type="NumericalMismatch">`` whose message names the reason and the key metrics and
whose text lists every metric; a row with no verdict is ``<skipped>``. A session that ended in
``error`` gets an extra ``session`` testcase with an ``<error>``. Text is made XML-1.0 safe
(characters XML forbids are replaced by U+FFFD) and escaped by ElementTree.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime
from typing import TYPE_CHECKING

from ..storage.session_record import SessionRecord
from ._common import METRICS, fmt_num
from ._drilldown import drilldown_culprits
from .documents import ReportSource, stored

if TYPE_CHECKING:
    from ..services.validation.results import CheckpointResult


__all__ = ["render_junit"]

_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: object) -> str:
    return _XML_BAD.sub("\ufffd", "" if value is None else str(value))


def _duration(session: SessionRecord) -> float | None:
    try:
        a, b = session.started_at, session.finished_at
        if a and b:
            return max(0.0, (datetime.fromisoformat(str(b)) - datetime.fromisoformat(str(a))).total_seconds())
    except ValueError:
        return None
    return None


def _failure(r: CheckpointResult, first: bool) -> tuple[str, str]:
    """A failing checkpoint's message (reason, key metrics) and text (every metric, isolation, tolerance)."""
    c = r.comparison
    metrics = ", ".join(f"{m}={fmt_num(getattr(c, m))}" for m in ("max_abs_error", "max_rel_error", "mismatch_percent",
                                                                 "cosine_similarity") if getattr(c, m) is not None)
    msg = f"{r.reason or 'over tolerance'}{' [first divergence]' if first else ''}; {metrics}"
    detail = "\n".join(f"{m}: {fmt_num(getattr(c, m), 8)}" for m in METRICS if getattr(c, m) is not None)
    tolerance = None if r.tolerance is None else r.tolerance.to_dict()
    worst = [w.to_dict() for w in c.worst] if c.worst else None
    for extra, value in (("introduced_error", r.introduced_error), ("propagated_error", r.propagated_error),
                         ("tolerance", tolerance), ("worst", worst)):
        if value is not None:
            detail += f"\n{extra}: {value}"
    return msg, detail


def render_junit(report: ReportSource) -> str:
    """The stored session as JUnit XML: one testcase per checkpoint (see the module's docstring)."""
    view = stored(report)
    session, rows, first = view.record, view.rows, view.first_divergence
    model = session.model_path or report.session_id
    classname = "debug_framework." + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{session.reference_backend}_vs_"
                                                                      f"{session.alternative_backend}")
    failures = sum(1 for r in rows if r.state is False)
    skipped = sum(1 for r in rows if r.state is None)
    errored = session.status == "error"
    total = len(rows) + (1 if errored else 0)
    dur = _duration(session)

    suites = ET.Element("testsuites", name="debug_framework validation", tests=str(total), failures=str(failures),
                        errors=str(int(errored)), skipped=str(skipped))
    suite = ET.SubElement(suites, "testsuite", name=_x(f"validation {model}"), tests=str(total),
                          failures=str(failures), errors=str(int(errored)), skipped=str(skipped),
                          time=f"{dur or 0.0:.3f}", timestamp=_x(session.created_at or ""))
    props = ET.SubElement(suite, "properties")
    for name, value in (("session_id", report.session_id), ("model_path", session.model_path or None),
                        ("weights_digest", session.weights_digest),
                        ("reference_backend", session.reference_backend or None),
                        ("alternative_backend", session.alternative_backend or None),
                        ("status", report.overall_status), ("verdict", view.verdict),
                        ("first_divergence", None if first is None else first.id)):
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_x(value))
    if (culprits := drilldown_culprits(view.result.drilldown)) is not None:
        ET.SubElement(props, "property", name="drilldown_culprits", value=_x(culprits))
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=_x(classname), name=_x(r.id), time="0")
        if r.state is False:
            msg, detail = _failure(r, r is first)
            fail = ET.SubElement(case, "failure", message=_x(msg), type="NumericalMismatch")
            fail.text = _x(detail)
        elif r.state is None:
            ET.SubElement(case, "skipped", message=_x(r.reason or "no verdict stored for this checkpoint"))
    if errored:
        case = ET.SubElement(suite, "testcase", classname=_x(classname), name="session", time=f"{dur or 0.0:.3f}")
        err = ET.SubElement(case, "error", message=_x(session.error_message or "session ended in error"),
                            type="SessionError")
        err.text = _x(session.error_message or "")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
