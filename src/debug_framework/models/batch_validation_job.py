"""``BatchValidationJob``: validate many models, in parallel processes, resumably.

    job = BatchValidationJob("nightly-2024-06-01", ["m1", "m2", "m3"],
                             {"parallel_execution": True, "max_concurrent_jobs": 2,
                              "database_path": "/tmp/debug.db", "alternative_backend": "pytorch"})
    job.execute()         # -> one dict per model: status, session_id, verdict
    job.get_progress()    # from any process: counts by status, percent

The job lives in the database (``batch_jobs`` / ``batch_job_items``): workers claim items
atomically, and each model's session is recorded as soon as it finishes. The session id of item
``i`` is derived from ``(job_id, i)``, so a job that was killed and is executed again finds what
was finished (and links it), discards the unfinished session of an interrupted item and runs it
again: no duplicate and no lost session. One executor per job at a time (a lock file beside the
database), so stale ``running`` items can be told from live ones.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import default_database_path, merge_config
from ..errors import DebugFrameworkError, ValidationError

__all__ = ["BatchValidationJob", "BATCH_OPTIONS", "item_session_id"]

#: Keys of a batch job's config that are the job's own (the rest is session configuration).
BATCH_OPTIONS = ("parallel_execution", "max_concurrent_jobs", "reference_backend", "alternative_backend",
                 "database_path", "show_progress", "retry_failed", "framework_config")

_NAMESPACE = uuid.UUID("6f1c2a52-7d0e-4f0a-9a43-5b0c1f1d2e3a")


def item_session_id(job_id: str, item_index: int) -> str:
    """The session id of item ``item_index`` of job ``job_id`` (stable across re-runs)."""
    return uuid.uuid5(_NAMESPACE, f"{job_id}:{int(item_index)}").hex


def _run_items(database_path: str, job_id: str, framework_config: dict[str, Any], session_config: dict[str, Any],
               reference: str, alternative: str) -> int:
    """Worker loop: claim pending items until none is left or the job is cancelled. Returns how many ran."""
    from ..services.database_manager import TERMINAL_STATUSES
    from ..services.validation_engine import ValidationEngine

    engine = ValidationEngine(database_path, config=framework_config)
    db = engine.db
    ran = 0
    while True:
        job = db.get_batch_job(job_id)
        if job is None or job["status"] == "cancelled":
            return ran
        item = db.claim_batch_item(job_id)
        if item is None:
            return ran
        idx = int(item["item_index"])
        sid = item_session_id(job_id, idx)
        existing = db.get_session(sid)
        if existing is not None and existing["status"] in TERMINAL_STATUSES:
            # finished before an interruption, but not yet linked to its item
            status = "failed" if existing["status"] == "error" else "done"
            db.update_batch_item(job_id, idx, status=status, session_id=sid,
                                 error_message=existing.get("error_message") if status == "failed" else None)
            continue
        if existing is not None:  # interrupted half way: its partial rows are discarded, the model runs again
            engine.cleanup_session(sid, delete_records=True, force=True)
        try:
            engine.create_session(item["model_path"], session_config, reference, alternative, session_id=sid)
            engine.run(sid)
            db.update_batch_item(job_id, idx, status="done", session_id=sid)
        except DebugFrameworkError as exc:
            linked = sid if db.get_session(sid) is not None else None
            db.update_batch_item(job_id, idx, status="failed", session_id=linked, error_message=str(exc))
        ran += 1


@dataclass
class BatchValidationJob:
    """Validate ``model_paths`` one session each.

    Args:
        job_id: the job's id (re-using it resumes the job).
        model_paths: one entry per model (a path may repeat; each entry is its own item).
        config: job options (``parallel_execution``, ``max_concurrent_jobs``, ``reference_backend``,
            ``alternative_backend``, ``database_path``, ``show_progress``, ``retry_failed``,
            ``framework_config``); every other key is session configuration for each model.
    """

    job_id: str
    model_paths: list[str]
    config: dict[str, Any] = field(default_factory=dict)
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
            raise ValidationError(f"max_concurrent_jobs must be an integer >= 1, got {raw!r}") from exc
        if self.max_concurrent_jobs < 1:
            raise ValidationError(f"max_concurrent_jobs must be >= 1, got {self.max_concurrent_jobs}")
        if not self.model_paths:
            raise ValidationError("a batch job needs at least one model path")
        self.framework_config = merge_config(self.config.get("framework_config"))
        db_path = self.config.get("database_path") or default_database_path(self.framework_config)
        self.framework_config["database_path"] = str(db_path)
        self.session_config = {k: v for k, v in self.config.items() if k not in BATCH_OPTIONS}
        self.reference_backend = str(self.config.get("reference_backend", "python_reference"))
        self.alternative_backend = str(self.config.get("alternative_backend", "auto"))
        from ..services.database_manager import DatabaseManager

        self.db = DatabaseManager(db_path)
        self.database_path = self.db.database_path
        stored = {k: v for k, v in self.config.items() if k != "framework_config"}
        self.db.create_batch_job(self.model_paths, stored, job_id=self.job_id)  # no-op when it exists
        job = self.db.get_batch_job(self.job_id)
        assert job is not None
        if [i["model_path"] for i in job["items"]] != self.model_paths:
            raise ValidationError(f"batch job {self.job_id!r} already exists with other model paths",
                                  hint="use a new job id, or the same model list to resume it")

    # ---------------------------------------------------------------- control

    def _lock_path(self) -> Path:
        return self.database_path.parent / f".{self.database_path.name}.batch-{uuid.uuid5(_NAMESPACE, self.job_id).hex}.lock"

    def execute(self, *, progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run every unfinished item (resuming an interrupted or cancelled job) and return one
        dict per item: ``model_path``, ``status`` (done/failed/cancelled), ``session_id``,
        ``verdict`` (the session's status: passed/failed/error) and ``error``.

        Raises:
            ValidationError (DF005): another process is executing this job right now.
        """
        lock = open(self._lock_path(), "a+")  # noqa: SIM115 - held for the whole run
        try:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise ValidationError(f"batch job {self.job_id!r} is being executed by another process",
                                      hint="wait for it, or follow it with get_progress()") from exc
            self._reset_interrupted()
            self.db.update_batch_job_status(self.job_id, "running")
            show = bool(self.config.get("show_progress", False))
            args = (str(self.database_path), self.job_id, self.framework_config, self.session_config,
                    self.reference_backend, self.alternative_backend)
            pending = self.get_progress()["pending"]
            workers = min(self.max_concurrent_jobs, pending) if self.parallel_execution else 0
            if workers >= 1:
                ctx = mp.get_context("spawn")  # torch and threads do not survive fork well
                procs = [ctx.Process(target=_run_items, args=args, name=f"batch-{self.job_id}-{n}")
                         for n in range(workers)]
                for p in procs:
                    p.start()
                self._follow(procs, show, progress)
                for p in procs:
                    p.join()
                crashed = [p for p in procs if p.exitcode not in (0, None)]
                if crashed:
                    self._reset_interrupted()  # a crashed worker's item goes back to pending for the next run
            else:
                if show or progress:
                    import threading

                    done = threading.Event()
                    t = threading.Thread(target=self._follow, args=([], show, progress, done), daemon=True)
                    t.start()
                    try:
                        _run_items(*args)
                    finally:  # an error must not leave the follower polling (and its bar drawn)
                        done.set()
                        t.join()
                else:
                    _run_items(*args)
            prog = self.get_progress()
            job = self.db.get_batch_job(self.job_id)
            if job and job["status"] != "cancelled":
                final = "completed" if prog["pending"] == 0 and prog["running"] == 0 else "failed"
                self.db.update_batch_job_status(self.job_id, final)
            return self.results()
        finally:
            lock.close()

    def _reset_interrupted(self) -> None:
        """Items left ``running`` by a killed executor (we hold the job lock, so none is live) and
        cancelled ones go back to ``pending``; failed ones too with ``retry_failed``."""
        job = self.db.get_batch_job(self.job_id)
        retry = {"running", "cancelled"} | ({"failed"} if self.config.get("retry_failed") else set())
        for item in job["items"] if job else []:
            if item["status"] in retry:
                if item["status"] == "failed" and item.get("session_id"):
                    self.db.delete_session(item["session_id"])  # its error session is replaced by the retry
                self.db.update_batch_item(self.job_id, item["item_index"], status="pending")

    def _follow(self, procs: Sequence[Any], show: bool, progress: Callable[[dict[str, Any]], None] | None,
                done_event: Any = None) -> None:
        """Poll the database for progress until the workers exit (or ``done_event`` is set)."""
        bar = None
        if show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar = Progress(TextColumn(f"batch {self.job_id}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            bar.start()
            task = bar.add_task("models", total=len(self.model_paths))

        def alive() -> bool:
            if done_event is not None:
                return not done_event.is_set()
            return any(p.is_alive() for p in procs)

        try:
            while True:
                running = alive()
                prog = self.get_progress()
                if bar is not None:
                    bar.update(task, completed=prog["finished"])
                if progress is not None:
                    progress(prog)
                if not running:
                    return
                time.sleep(0.25)
        finally:
            if bar is not None:
                bar.stop()

    def cancel(self) -> bool:
        """Stop handing out items (workers finish the model they are on); the pending items are
        marked cancelled. Executing the job again resumes it. Returns True."""
        self.db.update_batch_job_status(self.job_id, "cancelled")
        job = self.db.get_batch_job(self.job_id)
        for item in job["items"] if job else []:
            if item["status"] == "pending":
                self.db.update_batch_item(self.job_id, item["item_index"], status="cancelled")
        return True

    # ---------------------------------------------------------------- reading

    def get_progress(self) -> dict[str, Any]:
        """Counts by item status, ``finished`` (done + failed), ``percent`` and the job status."""
        job = self.db.get_batch_job(self.job_id)
        items = job["items"] if job else []
        counts = {s: 0 for s in ("pending", "running", "done", "failed", "cancelled")}
        for item in items:
            counts[item["status"]] = counts.get(item["status"], 0) + 1
        finished = counts["done"] + counts["failed"]
        total = len(items)
        return {"job_id": self.job_id, "status": job["status"] if job else None, "total": total, **counts,
                "finished": finished, "percent": 100.0 * finished / total if total else 100.0}

    def results(self) -> list[dict[str, Any]]:
        """One dict per item, in the job's order."""
        job = self.db.get_batch_job(self.job_id)
        out = []
        for item in job["items"] if job else []:
            sid = item.get("session_id")
            sess = self.db.get_session(sid) if sid else None
            res = (sess or {}).get("results") or {}
            out.append({"item_index": item["item_index"], "model_path": item["model_path"], "status": item["status"],
                        "session_id": sid, "verdict": sess["status"] if sess else None,
                        "first_divergence": res.get("first_divergence"), "error": item.get("error_message")})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "model_paths": list(self.model_paths), "config": dict(self.config),
                "parallel_execution": self.parallel_execution, "max_concurrent_jobs": self.max_concurrent_jobs}

