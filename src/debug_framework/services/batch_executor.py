"""``BatchExecutor``: runs a :class:`~debug_framework.models.batch_validation_job.BatchValidationJob`
with the validation engine, in this process or in spawned worker processes.

The composition root (``debug_framework/__init__.py``) installs it as the records' default
(:data:`~debug_framework.models.batch_validation_job.BATCH_EXECUTOR`), so ``job.execute()`` works
as the spec shows; ``job.execute(executor=BatchExecutor())`` says it explicitly.

One executor per job at a time (a lock file beside the database, see ``job.lock_path()``), so
items left ``running`` by a killed executor can be told from live ones and are run again.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import threading
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from ..errors import ValidationError
from ..models.batch_validation_job import BatchValidationJob, ProgressCallback, item_session_id
from ..storage.sessions import TERMINAL_STATUSES

__all__ = ["BatchExecutor", "run_items"]

_POLL_S = 0.25


def run_items(database_path: str, job_id: str, framework_config: dict[str, Any], session_config: dict[str, Any],
              reference: str, alternative: str) -> int:
    """Worker loop: claim pending items until none is left or the job is cancelled. Returns how many ran."""
    from .validation_engine import ValidationEngine, failure_message

    engine = ValidationEngine(database_path, config=framework_config)
    db = engine.db
    ran = 0
    while True:
        job = db.batches.get(job_id)
        if job is None or job["status"] == "cancelled":
            return ran
        item = db.batches.claim_item(job_id)
        if item is None:
            return ran
        idx = int(item["item_index"])
        sid = item_session_id(job_id, idx)
        existing = db.sessions.get(sid)
        if existing is not None and existing["status"] in TERMINAL_STATUSES:
            # finished before an interruption, but not yet linked to its item
            status = "failed" if existing["status"] == "error" else "done"
            db.batches.update_item(job_id, idx, status=status, session_id=sid,
                                   error_message=existing.get("error_message") if status == "failed" else None)
            continue
        if existing is not None:  # interrupted half way: its partial rows are discarded, the model runs again
            engine.cleanup_session(sid, delete_records=True, force=True)
        try:
            engine.create_session(item["model_path"], session_config, reference, alternative, session_id=sid)
            engine.run(sid)
            db.batches.update_item(job_id, idx, status="done", session_id=sid)
        except Exception as exc:  # noqa: BLE001 - one item's failure (or a bug it hit) must not stop the job
            linked = sid if db.sessions.get(sid) is not None else None
            db.batches.update_item(job_id, idx, status="failed", session_id=linked, error_message=failure_message(exc))
        ran += 1


class BatchExecutor:
    """Runs a job's unfinished items: ``parallel_execution`` spreads them over up to
    ``max_concurrent_jobs`` spawned processes, else they run here; progress is polled from the
    database (a rich bar with ``show_progress``, and/or the ``progress`` callback)."""

    def execute(self, job: BatchValidationJob, *, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        """Run every unfinished item of ``job`` and return ``job.results()``.

        Raises:
            ValidationError (DF005): another process is executing this job right now.
        """
        lock = open(job.lock_path(), "a+")  # noqa: SIM115 - held for the whole run
        try:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise ValidationError(f"batch job {job.job_id!r} is being executed by another process",
                                      hint="wait for it, or follow it with get_progress()") from exc
            self._reset_interrupted(job)
            job.db.batches.set_status(job.job_id, "running")
            self._run(job, progress)
            self._finish(job)
            return job.results()
        finally:
            lock.close()

    def _run(self, job: BatchValidationJob, progress: ProgressCallback | None) -> None:
        show = bool(job.config.get("show_progress", False))
        args = (str(job.database_path), job.job_id, job.framework_config, job.session_config,
                job.reference_backend, job.alternative_backend)
        pending = job.get_progress()["pending"]
        workers = min(job.max_concurrent_jobs, pending) if job.parallel_execution else 0
        if workers >= 1:
            ctx = mp.get_context("spawn")  # torch and threads do not survive fork well
            procs = [ctx.Process(target=run_items, args=args, name=f"batch-{job.job_id}-{n}") for n in range(workers)]
            for p in procs:
                p.start()
            self._follow(job, procs, show, progress)
            for p in procs:
                p.join()
            if any(p.exitcode not in (0, None) for p in procs):
                self._reset_interrupted(job)  # a crashed worker's item goes back to pending for the next run
        elif show or progress:
            done = threading.Event()
            t = threading.Thread(target=self._follow, args=(job, [], show, progress, done), daemon=True)
            t.start()
            try:
                run_items(*args)
            finally:  # an error must not leave the follower polling (and its bar drawn)
                done.set()
                t.join()
        else:
            run_items(*args)

    @staticmethod
    def _finish(job: BatchValidationJob) -> None:
        """Completed when no item is left pending or running; failed otherwise (unless cancelled)."""
        prog = job.get_progress()
        if prog["status"] is not None and prog["status"] != "cancelled":
            final = "completed" if prog["pending"] == 0 and prog["running"] == 0 else "failed"
            job.db.batches.set_status(job.job_id, final)

    @staticmethod
    def _reset_interrupted(job: BatchValidationJob) -> None:
        """Items left ``running`` by a killed executor (we hold the job lock, so none is live) and
        cancelled ones go back to ``pending``; failed ones too with ``retry_failed``."""
        retry = {"running", "cancelled"} | ({"failed"} if job.config.get("retry_failed") else set())
        for item in job.items():
            if item["status"] in retry:
                if item["status"] == "failed" and item.get("session_id"):
                    job.db.sessions.delete(item["session_id"])  # its error session is replaced by the retry
                job.db.batches.update_item(job.job_id, item["item_index"], status="pending")

    @staticmethod
    def _follow(job: BatchValidationJob, procs: Sequence[BaseProcess], show: bool,
                progress: ProgressCallback | None, done_event: threading.Event | None = None) -> None:
        """Poll the database for progress until the workers exit (or ``done_event`` is set)."""
        bar = None
        if show:
            from rich.markup import escape
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            # the job id is user text: shown as the task's description, escaped (never markup nor a format field)
            bar = Progress(TextColumn("batch {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            bar.start()
            task = bar.add_task(escape(job.job_id), total=len(job.model_paths))

        def alive() -> bool:
            if done_event is not None:
                return not done_event.is_set()
            return any(p.is_alive() for p in procs)

        try:
            while True:
                running = alive()
                prog = job.get_progress()
                if bar is not None:
                    bar.update(task, completed=prog["finished"])
                if progress is not None:
                    progress(prog)
                if not running:
                    return
                time.sleep(_POLL_S)
        finally:
            if bar is not None:
                bar.stop()
