"""The spec faces' upper-layer collaborators, installed by the composition root.

Records (:mod:`debug_framework.models`) never import services or reports. The two spec faces that
need them (:mod:`debug_framework.compat`: ``ValidationReport.generate_html_report``/``save_to_file``
render, ``BatchValidationJob.execute`` runs the job) call a collaborator given to the call, else the
process default in a slot. ``debug_framework/__init__.py`` calls :func:`install_record_collaborators`
once, so every import of the package fills the slots (by role, through ``models._common``: neither
``compat`` nor the record modules are imported); the factories import the upper layer only when
first used (``import debug_framework`` stays fast). The project's own code calls
``reports.render_report`` and ``services.executors.execute_job`` directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backend_prefixes import register_backend_prefix
from ..models._common import BATCH_EXECUTOR_ROLE, REPORT_RENDERER_ROLE, install_default

if TYPE_CHECKING:
    from ..compat import JobRunner, ReportRenderer

__all__ = ["install_record_collaborators", "install_backend_resolvers"]


def _report_renderer() -> ReportRenderer:
    from ..reports import render_report

    return render_report


def _batch_runner() -> JobRunner:
    from .executors import execute_job

    return execute_job


def install_record_collaborators() -> None:
    """Fill the spec faces' default slots: ``reports.render_report`` and ``executors.execute_job``."""
    install_default(REPORT_RENDERER_ROLE, _report_renderer)
    install_default(BATCH_EXECUTOR_ROLE, _batch_runner)


def _plugin_backend(plugin_id: str) -> Any:
    from .plugin_registry import plugin_backend_factory

    return plugin_backend_factory(plugin_id)


def install_backend_resolvers() -> None:
    """Let the backend registry resolve ``plugin:<id>`` (a plugin's kernels swapped into the PyTorch
    model) through :mod:`.plugin_registry`, imported when such a name is first asked for."""
    register_backend_prefix("plugin", _plugin_backend)
