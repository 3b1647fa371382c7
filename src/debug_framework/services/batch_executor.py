"""``BatchExecutor``: runs a :class:`~debug_framework.models.batch_validation_job.BatchValidationJob`
with the validation engine, in this process or in spawned worker processes.

Run a job with ``BatchExecutor().execute(job)``, or with ``services.executors.execute_job(job)``,
which picks the executor the job's configuration names (the spec's ``job.execute()`` goes there).

One executor per job at a time (a lock file beside the database, see ``job.lock_path()``). Each
item is claimed under an owner and heartbeat lease (:mod:`debug_framework.storage.leases`, the
same mechanism as a running session's), so an item left ``running`` by a dead process is told from
one a live process still works on: the first is run again, the second is waited for, never run
twice at once. Workers die with their executor: on Linux the parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``), elsewhere a thread watching the parent pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from ..errors import ValidationError
from ..jsonio import JsonObject
from ..orphans import die_with_parent
from ..models.batch_validation_job import BatchValidationJob, ProgressCallback, item_session_id
from ..storage.leases import holding, is_abandoned, live_running_items, owner_gone, sweep
from ..storage.sessions import TERMINAL_STATUSES

if TYPE_CHECKING:
    from ..models.session_config import SessionConfig
    from .validation_engine import ValidationEngine

__all__ = ["BatchExecutor", "run_items", "die_with_parent", "job_lock", "settle_existing"]

_POLL_S = 0.25


def _resume_state(engine: ValidationEngine, sid: str) -> str:
    """What to do with the item whose session id is ``sid``: ``"run"`` (nothing usable there;
    an abandoned or half-made session is deleted first), ``"link"`` (it finished before an
    interruption) or ``"busy"`` (a live process other than its item's owner runs it)."""
    existing = engine.db.sessions.get(sid)
    if existing is None:
        return "run"
    status = existing["status"]
    if status == "running" and not owner_gone(existing, time.time(), 0.0):
        return "busy"
    if status in TERMINAL_STATUSES and not is_abandoned(existing.get("error_message")):
        return "link"
    # interrupted half way, or its owner died: the partial rows are discarded, the model runs again
    engine.cleanup_session(sid, delete_records=True, force=True)
    return "run"


def run_items(database_path: str, job_id: str, framework_config: JsonObject, session_config: SessionConfig,
              reference: str, alternative: str, *, parent_pid: int | None = None) -> int:
    """Worker loop: claim pending items until none is left or the job is cancelled. Returns how many ran.

    ``parent_pid``: the executor of a worker process (the worker dies with it, :func:`die_with_parent`).
    """
    from .validation_engine import ValidationEngine

    if parent_pid is not None:
        die_with_parent(parent_pid)
    engine = ValidationEngine(database_path, config=framework_config)
    ran = 0
    with holding(engine.db, engine.resources.heartbeat_interval):  # the leases of the items claimed here
        while True:
            job = engine.db.batches.get(job_id)
            if job is None or job["status"] == "cancelled":
                return ran
            item = engine.db.batches.claim_item(job_id)
            if item is None:
                return ran
            try:
                ran += _run_item(engine, job_id, item, session_config, reference, alternative)
            except BaseException:  # Ctrl-C, a database error: give the claim back, never leave it "ours"
                with contextlib.suppress(Exception):
                    engine.db.batches.update_item(job_id, int(item["item_index"]), status="pending", if_owned=True)
                raise


def settle_existing(engine: ValidationEngine, job_id: str, idx: int) -> bool:
    """Settle claimed item ``idx`` from what its session already is, True when that was enough:
    it finished before an interruption (linked to the item now), or a live process other than its
    owner runs it (the item fails). False: the item must run (a half-made session was deleted)."""
    db, sid = engine.db, item_session_id(job_id, idx)
    state = _resume_state(engine, sid)
    if state == "link":  # finished before an interruption, but not yet linked to its item
        existing = db.sessions.get(sid)
        failed = existing["status"] == "error"
        db.batches.update_item(job_id, idx, status="failed" if failed else "done", session_id=sid,
                               error_message=existing.get("error_message") if failed else None, if_owned=True)
        return True
    if state == "busy":
        db.batches.update_item(job_id, idx, status="failed", error_message=f"session {sid} is being run by another "
                               "live process", if_owned=True)
        return True
    return False


def _run_item(engine: ValidationEngine, job_id: str, item: JsonObject, session_config: SessionConfig, reference: str,
              alternative: str) -> int:
    """Run (or link) one claimed item; 1 when a validation ran. The item's outcome is only written
    while this process still holds its lease."""
    from .validation_engine import failure_message

    db, idx = engine.db, int(item["item_index"])
    sid = item_session_id(job_id, idx)
    if settle_existing(engine, job_id, idx):
        return 0
    try:
        engine.create_session(item["model_path"], session_config, reference, alternative, session_id=sid)
        engine.run(sid)
        db.batches.update_item(job_id, idx, status="done", session_id=sid, if_owned=True)
    except Exception as exc:  # noqa: BLE001 - one item's failure (or a bug it hit) must not stop the job
        linked = sid if db.sessions.get(sid) is not None else None
        db.batches.update_item(job_id, idx, status="failed", session_id=linked, error_message=failure_message(exc),
                               if_owned=True)
    return 1


@contextlib.contextmanager
def job_lock(job: BatchValidationJob) -> Iterator[None]:
    """Hold the job's lock file (one executor per job at a time, whichever kind).

    Raises:
        ValidationError (DF005): another process is executing this job right now.
    """
    with open(job.lock_path(), "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ValidationError(f"batch job {job.job_id!r} is being executed by another process",
                                  hint="wait for it, or follow its progress (session_report, the dashboard)") from exc
        yield


class BatchExecutor:
    """Runs a job's unfinished items: ``parallel_execution`` spreads them over up to
    ``max_concurrent_jobs`` spawned processes, else they run here; progress is polled from the
    database (a rich bar with ``show_progress``, and/or the ``progress`` callback)."""

    def execute(self, job: BatchValidationJob, *, progress: ProgressCallback | None = None) -> list[JsonObject]:
        """Run every unfinished item of ``job`` and return ``job.results()``.

        Raises:
            ValidationError (DF005): another process is executing this job right now.
        """
        with job_lock(job):
            self._reset_interrupted(job)
            job.db.batches.set_status(job.job_id, "running")
            crashed = self._run(job, progress)
            while not crashed and self._await_others(job):  # items a live process held, then gave up
                crashed = self._run(job, progress)
            self._finish(job)
            return job.results()

    def _run(self, job: BatchValidationJob, progress: ProgressCallback | None) -> bool:
        """One round over the pending items; True when a worker process crashed."""
        show = bool(job.config.get("show_progress", False))
        args = (str(job.db.target), job.job_id, job.framework_config, job.session_config,
                job.reference_backend, job.alternative_backend)
        pending = job.db.batches.progress(job.job_id)["pending"]
        workers = min(job.max_concurrent_jobs, pending) if job.parallel_execution else 0
        if workers >= 1:
            ctx = mp.get_context("spawn")  # torch and threads do not survive fork well
            procs = [ctx.Process(target=run_items, args=args, kwargs={"parent_pid": os.getpid()},
                                 name=f"batch-{job.job_id}-{n}") for n in range(workers)]
            for p in procs:
                p.start()
            self._follow(job, procs, show, progress)
            for p in procs:
                p.join()
            if any(p.exitcode not in (0, None) for p in procs):
                self._reset_interrupted(job)  # a crashed worker's item goes back to pending for the next run
                return True
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
        return False

    @staticmethod
    def _await_others(job: BatchValidationJob) -> bool:
        """Wait while items of the job are running under another live owner (a process of an
        earlier run of the job); True when some came back pending (their owner died) to run now."""
        while live_running_items(job.db, job.job_id):
            time.sleep(_POLL_S)
        sweep(job.db, job_id=job.job_id, legacy_after_s=0.0)
        return job.db.batches.progress(job.job_id)["pending"] > 0 and job.db.batches.get(job.job_id)["status"] != "cancelled"

    @staticmethod
    def _finish(job: BatchValidationJob) -> None:
        """Completed when no item is left pending or running; failed otherwise (unless cancelled)."""
        prog = job.db.batches.progress(job.job_id)
        if prog["status"] is not None and prog["status"] != "cancelled":
            final = "completed" if prog["pending"] == 0 and prog["running"] == 0 else "failed"
            job.db.batches.set_status(job.job_id, final)

    @staticmethod
    def _reset_interrupted(job: BatchValidationJob) -> None:
        """Items left ``running`` by a dead process (its lease says so; an item a live process
        still runs stays its) and cancelled ones go back to ``pending``; failed ones too with
        ``retry_failed``."""
        sweep(job.db, job_id=job.job_id, legacy_after_s=0.0)
        retry = {"cancelled"} | ({"failed"} if job.config.get("retry_failed") else set())
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

            from ..termtext import terminal_safe
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            # the job id is user text: shown as the task's description, escaped (never markup nor a format field)
            bar = Progress(TextColumn("batch {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            bar.start()
            task = bar.add_task(escape(terminal_safe(job.job_id)), total=len(job.model_paths))

        def alive() -> bool:
            if done_event is not None:
                return not done_event.is_set()
            return any(p.is_alive() for p in procs)

        try:
            while True:
                running = alive()
                prog = job.db.batches.progress(job.job_id)
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
