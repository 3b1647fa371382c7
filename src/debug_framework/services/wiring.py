"""The records' upper-layer collaborators, installed by the composition root.

Records (:mod:`debug_framework.models`) never import services or reports. The two spec methods
that need them - ``ValidationReport.generate_html_report``/``save_to_file`` (rendering) and
``BatchValidationJob.execute`` (the validation engine) - call a collaborator given to the call or
the record, else the process default in a slot of the record's module. ``debug_framework/__init__.py``
calls :func:`install_record_collaborators` once, so every import of the package fills the slots;
the factories import the upper layer only when first used (``import debug_framework`` stays fast).
"""

from __future__ import annotations

from ..models.batch_validation_job import BATCH_EXECUTOR, BatchExecutor
from ..models.validation_report import REPORT_RENDERER, ReportRenderer

__all__ = ["install_record_collaborators"]


def _report_renderer() -> ReportRenderer:
    from ..reports import render_report

    return render_report


def _batch_executor() -> BatchExecutor:
    from .batch_executor import BatchExecutor as Executor

    return Executor()


def install_record_collaborators() -> None:
    """Fill the records' default slots: ``reports.render_report`` and a ``BatchExecutor``."""
    REPORT_RENDERER.install(_report_renderer)
    BATCH_EXECUTOR.install(_batch_executor)
