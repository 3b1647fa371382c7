"""Running a batch job with the executor its configuration names: the one call the CLI, the
dashboard and the spec's ``BatchValidationJob.execute`` (through the composition root's default)
go through.

    results = execute_job(BatchValidationJob("nightly", models, {"executor": "ray"}), progress=show)

``config["executor"]`` is ``local`` (the default: :class:`~.batch_executor.BatchExecutor`, this
process or spawned worker processes) or ``ray`` (:class:`~.ray_executor.RayExecutor`, imported
only then).
"""

from __future__ import annotations


from ..compat import JobExecutor
from ..jsonio import JsonObject
from ..models.batch_validation_job import BatchValidationJob, ProgressCallback
from .batch_executor import BatchExecutor

__all__ = ["executor_for", "execute_job"]


def executor_for(job: BatchValidationJob) -> JobExecutor:
    """The executor ``job.config["executor"]`` names: a ``BatchExecutor`` or a ``RayExecutor``
    (the job checked the name when it was made)."""
    if job.config.get("executor", "local") == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor()
    return BatchExecutor()


def execute_job(job: BatchValidationJob, *, progress: ProgressCallback | None = None) -> list[JsonObject]:
    """Run every unfinished item of ``job`` (resuming it) with the executor its configuration names;
    returns ``job.results()``. ``progress`` is called with the job's progress
    (``job.db.batches.progress``) while it runs.

    Raises:
        ValidationError (DF005): another process is executing this job right now.
    """
    return executor_for(job).execute(job, progress=progress)
