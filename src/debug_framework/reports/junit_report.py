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
from typing import Any

from ._common import METRICS, first_divergence_key, fmt_num, passed_state, row_id, row_place, session_results, verdict_of
from ._drilldown import drilldown_culprits
from .documents import ReportSource


__all__ = ["render_junit"]

_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: Any) -> str:
    return _XML_BAD.sub("\ufffd", "" if value is None else str(value))


def _duration(session: dict[str, Any]) -> float | None:
    try:
        a, b = session.get("started_at"), session.get("finished_at")
        if a and b:
            return max(0.0, (datetime.fromisoformat(str(b)) - datetime.fromisoformat(str(a))).total_seconds())
    except ValueError:
        return None
    return None


def render_junit(report: ReportSource) -> str:
    session = dict(report.session or {})
    rows = report.checkpoint_results
    results = session_results(session)
    first = first_divergence_key(rows, results)
    model = str(session.get("model_path") or report.session_id)
    classname = "debug_framework." + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{session.get('reference_backend')}_vs_"
                                                                      f"{session.get('alternative_backend')}")
    failures = sum(1 for r in rows if passed_state(r) is False)
    skipped = sum(1 for r in rows if passed_state(r) is None)
    errored = session.get("status") == "error"
    total = len(rows) + (1 if errored else 0)
    dur = _duration(session)

    suites = ET.Element("testsuites", name="debug_framework validation", tests=str(total), failures=str(failures),
                        errors=str(int(errored)), skipped=str(skipped))
    suite = ET.SubElement(suites, "testsuite", name=_x(f"validation {model}"), tests=str(total),
                          failures=str(failures), errors=str(int(errored)), skipped=str(skipped),
                          time=f"{dur or 0.0:.3f}", timestamp=_x(session.get("created_at") or ""))
    props = ET.SubElement(suite, "properties")
    for name, value in (("session_id", report.session_id), ("model_path", session.get("model_path")),
                        ("weights_digest", session.get("weights_digest")),
                        ("reference_backend", session.get("reference_backend")),
                        ("alternative_backend", session.get("alternative_backend")),
                        ("status", report.overall_status), ("verdict", verdict_of(report.overall_status, results)),
                        ("first_divergence", None if first is None else row_id(first))):
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_x(value))
    if (culprits := drilldown_culprits(results)) is not None:
        ET.SubElement(props, "property", name="drilldown_culprits", value=_x(culprits))
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=_x(classname), name=_x(row_id(r)), time="0")
        p = passed_state(r)
        if p is False:
            metrics = ", ".join(f"{m}={fmt_num(r.get(m))}" for m in ("max_abs_error", "max_rel_error", "mismatch_percent",
                                                                    "cosine_similarity") if r.get(m) is not None)
            mark = " [first divergence]" if first is not None and row_place(r) == first else ""
            msg = f"{r.get('reason') or 'over tolerance'}{mark}; {metrics}"
            detail = "\n".join(f"{m}: {fmt_num(r.get(m), 8)}" for m in METRICS if r.get(m) is not None)
            for extra in ("introduced_error", "propagated_error", "tolerance", "worst"):
                if r.get(extra) is not None:
                    detail += f"\n{extra}: {r.get(extra)}"
            fail = ET.SubElement(case, "failure", message=_x(msg), type="NumericalMismatch")
            fail.text = _x(detail)
        elif p is None:
            ET.SubElement(case, "skipped", message=_x(r.get("reason") or "no verdict stored for this checkpoint"))
    if errored:
        case = ET.SubElement(suite, "testcase", classname=_x(classname), name="session", time=f"{dur or 0.0:.3f}")
        err = ET.SubElement(case, "error", message=_x(session.get("error_message") or "session ended in error"),
                            type="SessionError")
        err.text = _x(session.get("error_message") or "")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
