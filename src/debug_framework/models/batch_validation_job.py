"""``BatchValidationJob``: validate many models, in parallel processes, resumably.

    job = BatchValidationJob("nightly-2024-06-01", ["m1", "m2", "m3"],
                             {"parallel_execution": True, "max_concurrent_jobs": 2,
                              "database_path": "/tmp/debug.db", "alternative_backend": "pytorch"})
    job.execute()         # -> one dict per model: status, session_id, verdict
    job.get_progress()    # from any process: counts by status, percent

The job lives in the database (the batch queue store: ``batch_jobs`` / ``batch_job_items``):
workers claim items atomically, and each model's session is recorded as soon as it finishes. The
session id of item ``i`` is derived from ``(job_id, i)`` (:func:`item_session_id`), so a job that
was killed and is executed again finds what was finished, and runs the rest: no duplicate and no
lost session.

This record is the job's data (its options, its items and their results). Running the models needs
the validation engine, an upper layer: the project runs a job with
``services.executors.execute_job(job)`` (the executor ``config["executor"]`` names) and reads its
progress from the batch queue store (``job.db.batches.progress(job.job_id)``). The spec's
``execute``, ``get_progress`` and ``cancel`` are faces over them, inherited from
:class:`debug_framework.compat.BatchJobFaces`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..compat import BatchJobFaces
from ..config import database_settings, default_database_path, merge_config
from ..errors import ConfigurationError
from ..jsonio import JsonObject
from ..storage.database import Database
from .session_config import SessionConfig

__all__ = ["BatchValidationJob", "BATCH_OPTIONS", "ProgressCallback", "item_session_id", "EXECUTORS"]

#: Keys of a batch job's config that are the job's own (the rest is session configuration).
BATCH_OPTIONS = ("parallel_execution", "max_concurrent_jobs", "reference_backend", "alternative_backend",
                 "database_path", "show_progress", "retry_failed", "framework_config", "executor", "ray_address",
                 "max_retries")

#: The executors a job can name in ``config["executor"]`` (``local`` processes are the default).
EXECUTORS = ("local", "ray")

_NAMESPACE = uuid.UUID("6f1c2a52-7d0e-4f0a-9a43-5b0c1f1d2e3a")

#: Called with :meth:`BatchValidationJob.get_progress` while a job runs.
ProgressCallback = Callable[[JsonObject], None]


def item_session_id(job_id: str, item_index: int) -> str:
    """The session id of item ``item_index`` of job ``job_id`` (stable across re-runs)."""
    return uuid.uuid5(_NAMESPACE, f"{job_id}:{int(item_index)}").hex


@dataclass
class BatchValidationJob(BatchJobFaces):
    """Validate ``model_paths`` one session each.

    Args:
        job_id: the job's id (re-using it resumes the job).
        model_paths: one entry per model (a path may repeat; each entry is its own item).
        config: job options (``parallel_execution``, ``max_concurrent_jobs``, ``reference_backend``,
            ``alternative_backend``, ``database_path``, ``show_progress``, ``retry_failed``,
            ``framework_config``, ``executor`` (``local`` or ``ray``), ``ray_address``, ``max_retries``
            (Ray: how often an item whose worker died is run again, default 2)); every other key is session configuration for each model.
    """

    job_id: str
    model_paths: list[str]
    config: JsonObject = field(default_factory=dict)
    parallel_execution: bool = field(init=False)
    max_concurrent_jobs: int = field(init=False)

    def __post_init__(self) -> None:
        self.model_paths = [str(p) for p in self.model_paths]
        self.config = dict(self.config or {})
        self.parallel_execution = bool(self.config.get("parallel_execution", False))
        raw = self.config.get("max_concurrent_jobs", max(1, (os.cpu_count() or 2) // 2))
        try:
            self.max_concurrent_jobs = int(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"max_concurrent_jobs must be an integer >= 1, got {raw!r}") from exc
        if self.max_concurrent_jobs < 1:
            raise ConfigurationError(f"max_concurrent_jobs must be >= 1, got {self.max_concurrent_jobs}")
        if not self.model_paths:
            raise ConfigurationError("a batch job needs at least one model path")
        if self.config.get("executor", "local") not in EXECUTORS:
            raise ConfigurationError(f"unknown batch executor {self.config.get('executor')!r}",
                                     hint=f"use one of {', '.join(EXECUTORS)}")
        #: every model's session configuration, validated once here (DF005 before anything is stored)
        self.session_config = SessionConfig.from_mapping(
            {k: v for k, v in self.config.items() if k not in BATCH_OPTIONS})
        self.framework_config = merge_config(self.config.get("framework_config"))
        db_path = self.config.get("database_path") or default_database_path(self.framework_config)
        self.framework_config["database_path"] = str(db_path)
        self.reference_backend = str(self.config.get("reference_backend", "python_reference"))
        self.alternative_backend = str(self.config.get("alternative_backend", "auto"))
        self.db = Database(db_path, **database_settings(self.framework_config))
        self.database_path = self.db.database_path
        stored = {k: v for k, v in self.config.items() if k != "framework_config"}
        if "database_path" in stored:
            stored["database_path"] = self.db.location  # a server URL's password is never stored
        self.db.batches.create(self.model_paths, stored, job_id=self.job_id)  # no-op when it exists
        job = self.db.batches.get(self.job_id)
        assert job is not None
        if [i["model_path"] for i in job["items"]] != self.model_paths:
            raise ConfigurationError(f"batch job {self.job_id!r} already exists with other model paths",
                                     hint="use a new job id, or the same model list to resume it")

    # ---------------------------------------------------------------- control

    def lock_path(self) -> Path:
        """The file an executor holds locked while it runs this job (beside the database)."""
        digest = uuid.uuid5(_NAMESPACE, self.job_id).hex
        return self.database_path.parent / f".{self.database_path.name}.batch-{digest}.lock"

    # ---------------------------------------------------------------- reading

    def items(self) -> list[JsonObject]:
        """The job's item rows, in order."""
        job = self.db.batches.get(self.job_id)
        return list(job["items"]) if job else []

    def results(self) -> list[JsonObject]:
        """One dict per item, in the job's order."""
        out = []
        for item in self.items():
            sid = item.get("session_id")
            sess = self.db.sessions.get(sid) if sid else None
            res = (sess or {}).get("results") or {}
            out.append({"item_index": item["item_index"], "model_path": item["model_path"], "status": item["status"],
                        "session_id": sid, "verdict": sess["status"] if sess else None,
                        "first_divergence": res.get("first_divergence"), "error": item.get("error_message")})
        return out

    def to_dict(self) -> JsonObject:
        return {"job_id": self.job_id, "model_paths": list(self.model_paths), "config": dict(self.config),
                "parallel_execution": self.parallel_execution, "max_concurrent_jobs": self.max_concurrent_jobs}
