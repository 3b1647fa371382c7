"""The records' upper-layer collaborators, installed by the composition root.

Records (:mod:`debug_framework.models`) never import services or reports. The two spec methods
that need them - ``ValidationReport.generate_html_report``/``save_to_file`` (rendering) and
``BatchValidationJob.execute`` (the validation engine) - call a collaborator given to the call or
the record, else the process default in a slot of the record's module. ``debug_framework/__init__.py``
calls :func:`install_record_collaborators` once, so every import of the package fills the slots
(by role, through ``models._common``: the record modules themselves are not imported); the
factories import the upper layer only when first used (``import debug_framework`` stays fast).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backend_prefixes import register_backend_prefix
from ..models._common import BATCH_EXECUTOR_ROLE, REPORT_RENDERER_ROLE, install_default

if TYPE_CHECKING:
    from ..models.batch_validation_job import BatchExecutor
    from ..models.validation_report import ReportRenderer

__all__ = ["install_record_collaborators", "install_backend_resolvers"]


def _report_renderer() -> ReportRenderer:
    from ..reports import render_report

    return render_report


class ConfiguredExecutor:
    """The default batch executor: the one the job's ``config["executor"]`` names, ``local``
    processes (:class:`~.batch_executor.BatchExecutor`, the default) or ``ray``
    (:class:`~.ray_executor.RayExecutor`)."""

    def execute(self, job: Any, *, progress: Any = None) -> list[dict[str, Any]]:
        if job.config.get("executor", "local") == "ray":
            from .ray_executor import RayExecutor

            return RayExecutor().execute(job, progress=progress)
        from .batch_executor import BatchExecutor as Executor

        return Executor().execute(job, progress=progress)


def _batch_executor() -> BatchExecutor:
    return ConfiguredExecutor()


def install_record_collaborators() -> None:
    """Fill the records' default slots: ``reports.render_report`` and a ``BatchExecutor``."""
    install_default(REPORT_RENDERER_ROLE, _report_renderer)
    install_default(BATCH_EXECUTOR_ROLE, _batch_executor)


def _plugin_backend(plugin_id: str) -> Any:
    from .plugin_registry import plugin_backend_factory

    return plugin_backend_factory(plugin_id)


def install_backend_resolvers() -> None:
    """Let the backend registry resolve ``plugin:<id>`` (a plugin's kernels swapped into the PyTorch
    model) through :mod:`.plugin_registry`, imported when such a name is first asked for."""
    register_backend_prefix("plugin", _plugin_backend)
