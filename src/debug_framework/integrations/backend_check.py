"""``assert_backend_matches``: run a validation session and fail like a test assertion.

    from debug_framework import assert_backend_matches

    result = assert_backend_matches("path/to/model", "my_backend", dtype="float32")

It creates and runs a session (the reference is ``python_reference`` unless ``reference_backend=``
says otherwise; keyword arguments are session config keys, see docs/validation.md). A passing
session returns its ``ValidationResult``. A failing one raises :class:`BackendMismatch`, an
``AssertionError`` whose message gives the verdict, the first divergence, the layers that introduce
error, the error source and, when a drill-down ran, the culprit operator and its repro.

A framework error (a bad model path, an unknown backend, a bad config key, a backend crashing) is
**not** a mismatch: the :class:`~debug_framework.errors.DebugFrameworkError` propagates with its
DF code, never as an ``AssertionError``. Under the pytest plugin (:mod:`.pytest_plugin`) the
session goes to ``--df-database``, the HTML report to ``--df-report-dir`` and both are attached to
the test report; elsewhere the configured database is used and no report is written unless
``report_dir=`` is given.

Nothing heavy is imported here at import time (the pytest plugin imports this module).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..services.validation.results import ValidationResult
    from ..services.validation_engine import ValidationEngine

__all__ = ["assert_backend_matches", "run_backend_check", "BackendMismatch", "CheckContext", "CheckOutcome",
           "failure_message", "CHECK_CONTEXT"]


@dataclass
class CheckContext:
    """Where checks run inside a test go: set by the pytest plugin around each test.

    ``database`` / ``report_dir`` are resolved on first use (callables), ``record`` attaches a
    ``(name, value)`` property to the running test, ``label`` names the report file."""

    database: Callable[[], Path | str]
    report_dir: Callable[[], Path]
    record: Callable[[str, str], None]
    label: str = "check"


#: The running test's context (None outside the pytest plugin).
CHECK_CONTEXT: ContextVar[CheckContext | None] = ContextVar("debug_framework_check_context", default=None)


class BackendMismatch(AssertionError):
    """The backend's results do not match the reference's (the session's verdict is ``failed``).

    ``result`` is the ``ValidationResult``; ``report_path`` the HTML report written, if any."""

    def __init__(self, message: str, result: ValidationResult, report_path: Path | None) -> None:
        super().__init__(message)
        self.result = result
        self.report_path = report_path


def _safe_name(text: str) -> str:
    """A file-name-safe version of ``text`` (a test id): never a path from unchecked text."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:80] or "check"


def _culprit_lines(result: ValidationResult) -> list[str]:
    """One line per drilled layer: the culprit operator and its repro, or why none was named."""
    from ..services.drilldown.types import drilled_where

    lines = []
    for drill in getattr(result, "drilldown", None) or []:
        culprit = drill.culprit
        if culprit is None:
            lines.append(f"drill-down of {drilled_where(drill.layer, drill.step)}: no operator named ({drill.note or 'no operator exceeds its bound'})")
            continue
        where = " at ".join(x for x in (culprit.op, culprit.module_path) if x)
        if culprit.source:
            where += f" ({culprit.source})"
        repro = f"; repro: {culprit.repro_dir}{' (verified)' if culprit.verified else ''}" if culprit.repro_dir else ""
        lines.append(f"culprit operator ({drilled_where(drill.layer, drill.step)}, {drill.method}): {where}{repro}")
    return lines


def failure_message(result: ValidationResult, report_path: Path | None = None, database: Path | str | None = None) -> str:
    """The assertion message of a failed session: verdict, first divergence, introducing layers,
    error source, culprit operators, and where the session and report are."""
    lines = [f"backend {result.alternative_backend!r} ({result.alternative_dtype}) does not match "
             f"{result.reference_backend!r} ({result.reference_dtype}) on {result.model_path}: "
             f"verdict {result.verdict}"]
    first = result.first_divergence
    if first is not None:
        lines.append(f"first divergence: {first.key} ({first.judged_by}): {first.reason or 'failed'}")
    if result.isolation is not None:
        lines.append(f"introducing layers: {result.introducing_layers or 'none'}")
    source = result.error_source
    if source:
        lines.append(f"error source: {source.get('detail') or source.get('kind')}")
    lines += _culprit_lines(result)
    where = f"session {result.session_id}" + (f" in {database}" if database is not None else "")
    lines.append(where + (f"; HTML report: {report_path}" if report_path is not None else ""))
    return "\n  ".join(lines)


def _write_report(engine: ValidationEngine, session_id: str, report_dir: Path, label: str) -> Path:
    """The session's HTML report in ``report_dir`` (created), named after the test and session."""
    from ..models._common import write_report_file
    from ..models.validation_report import ValidationReport
    from ..reports import render_report

    path = report_dir.expanduser() / f"{_safe_name(label)}-{session_id[:12]}.html"
    text = render_report(ValidationReport.from_session(session_id, engine.db), "html")
    write_report_file(path, text, hint="choose a writable report directory (--df-report-dir)")
    return path


@dataclass
class CheckOutcome:
    """What :func:`run_backend_check` did: the result, the HTML report written (or None) and the
    database holding the session."""

    result: ValidationResult
    report: Path | None
    database: str


def _record(ctx: CheckContext | None, result: ValidationResult, report: Path | None) -> None:
    """Attach the session's verdict, report, first divergence and culprits to the running test."""
    if ctx is None:
        return
    ctx.record("df_verdict", result.verdict)
    if report is not None:
        ctx.record("df_report", str(report))
    if result.first_divergence is not None:
        ctx.record("df_first_divergence", str(result.first_divergence.key))
    for drill in getattr(result, "drilldown", None) or []:
        if drill.culprit is not None:
            ctx.record("df_culprit", f"layer {drill.layer}: {drill.culprit.op}")


def run_backend_check(model_path: str | Path, backend: str, *, reference_backend: str = "auto",
                      database: str | Path | None = None, report_dir: str | Path | None = None,
                      **session_config: object) -> CheckOutcome:
    """Create and run the session; the database is ``database``, else the running test's (pytest
    plugin), else the configured one. Raises the framework's errors (DF codes) unchanged; a session
    that stops with one is recorded with status ``error``."""
    from .. import get_framework_config
    from ..services.validation_engine import ValidationEngine

    ctx = CHECK_CONTEXT.get()
    if database is None and ctx is not None:
        database = ctx.database()
    engine = ValidationEngine(database, config=get_framework_config())
    try:
        session_id = engine.create_session(model_path, session_config, reference_backend, backend)
        if ctx is not None:
            ctx.record("df_session_id", session_id)
            ctx.record("df_database", engine.db.location)
        result = engine.run(session_id)
        directory = Path(report_dir) if report_dir is not None else (ctx.report_dir() if ctx is not None else None)
        report = None if directory is None else _write_report(engine, session_id, directory,
                                                              ctx.label if ctx is not None else backend)
        _record(ctx, result, report)
        return CheckOutcome(result, report, engine.db.location)
    finally:
        engine.db.close()


def assert_backend_matches(model_path: str | Path, backend: str, *, reference_backend: str = "auto",
                           database: str | Path | None = None, report_dir: str | Path | None = None,
                           **session_config: object) -> ValidationResult:
    """Run a session of ``backend`` against ``reference_backend`` on ``model_path``; return the
    ``ValidationResult`` when it passes, raise :class:`BackendMismatch` (an ``AssertionError``)
    with the first divergence, introducing layers, error source and culprit operator when not.

    Keyword arguments beyond these are session config keys (``dtype="float32"``, ``seed=0``,
    ``isolate=True``, ...). Framework errors (DF001-DF008) propagate as they are."""
    outcome = run_backend_check(model_path, backend, reference_backend=reference_backend,
                                database=database, report_dir=report_dir, **session_config)
    if not outcome.result.passed:
        raise BackendMismatch(failure_message(outcome.result, outcome.report, outcome.database), outcome.result,
                              outcome.report)
    return outcome.result
