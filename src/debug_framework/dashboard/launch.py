"""Launching and cancelling work from the dashboard: a task row first, then a worker process.

:func:`launch_validation` / :func:`launch_batch` write the request to the database
(:class:`~debug_framework.storage.tasks.TaskStore`; a batch job's rows through
:class:`~debug_framework.models.batch_validation_job.BatchValidationJob` too) and start
``python -m debug_framework.dashboard.worker`` detached (its own session, output to a log file),
so the work never runs inside a Streamlit script run and outlives a browser reload. The database
travels to the worker in its environment (``PIE_DEBUG_DATABASE``), never on its command line, so a
server URL's password is not shown by ``ps``.

:func:`cancel` flags the task (``cancel_requested``, which a worker on any host reads at its next
progress report), then signals its worker (SIGTERM) only when the task's recorded owner is a live
process of this host; the worker ends the running session as ``error`` with a "cancelled" message
(:mod:`.worker`). The worker's pid is recorded on the task as soon as it is started, so one that
dies before taking its task reads as gone, not queued forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigurationError, FrameworkInitializationError
from ..storage.database import Database
from ..storage.leases import current_owner, process_owner
from ..storage.tasks import ACTIVE_STATES, TaskRecord, TaskStore, worker_gone
from .settings import Settings

if TYPE_CHECKING:
    from ..models.batch_validation_job import BatchValidationJob

__all__ = ["check_request", "launch_validation", "launch_batch", "cancel", "worker_log_path", "task_store", "stored_job",
           "session_config", "CANCELLED"]

#: What a cancelled session records as its error message (and the task as its message).
CANCELLED = "cancelled from the dashboard"


def task_store(settings: Settings) -> tuple[Database, TaskStore]:
    """The database opened for writing (created and migrated when needed) and its task store."""
    db = Database(settings.database)
    return db, TaskStore(db)


def worker_log_path(settings: Settings, task_id: str) -> Path:
    """Where a task's worker writes its output: ``$PIE_DEBUG_LOG_DIR``, else ``logs/`` beside the database."""
    from ..cli.framework import crash_log_dir

    folder = crash_log_dir(settings.database if isinstance(settings.database, Path) else None)
    return folder / f"dashboard-task-{task_id}.log"


def _spawn(settings: Settings, task_id: str) -> int:
    """Start the worker of ``task_id`` detached; returns its pid."""
    log = worker_log_path(settings, task_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings.environment(), "PIE_DEBUG_DATABASE": str(settings.database)}
    src = str(Path(__file__).resolve().parents[2])  # this source tree first, as in the app's process
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "debug_framework.dashboard.worker", "--task", task_id],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    return proc.pid


def _start_worker(settings: Settings, tasks: TaskStore, task_id: str) -> None:
    """Start the task's worker and record its pid on the queued task; when it cannot be started
    (the log folder or the process cannot be made) the task ends ``failed`` saying why, and the
    page gets a DF001 error."""
    try:
        pid = _spawn(settings, task_id)
    except OSError as exc:
        why = f"the worker process could not be started: {type(exc).__name__}: {exc}"
        tasks.finish(task_id, "failed", why)
        raise FrameworkInitializationError(why, hint="check that the log folder (PIE_DEBUG_LOG_DIR, else logs/ "
                                           "beside the database) is writable and the machine can start processes") from exc
    tasks.record_spawn(task_id, process_owner(pid))


_KNOBS = ("dtype", "seed", "input_shape", "isolate", "oracle", "noise_floor", "tensor_recording_enabled",
          "precision_thresholds", "noise_margin")


def session_config(knobs: Mapping[str, object]) -> dict[str, object]:
    """The session configuration of the launch form: only the knobs it offers, unset ones left out."""
    return {k: knobs[k] for k in _KNOBS if knobs.get(k) not in (None, "", {})}


def check_request(model_paths: list[str], reference: str, alternative: str,
                  backend_files: Sequence[str] = ()) -> None:
    """What a worker would find wrong, found on the page before any task is written: a model path
    that does not exist (DF004), a backend file that is missing or fails to import (DF005; it is
    imported here, as ``--backend-file`` is, so the backends it registers are known and offered)
    and a backend name nobody registered (DF002, with the closest one). ``auto`` (the alternative)
    and ``plugin:<id>`` names are resolved by the worker.

    Raises:
        ModelLoadingError, ConfigurationError, BackendInitializationError.
    """
    from ..backends.registry import registered_backends
    from ..errors import BackendInitializationError, ModelLoadingError
    from ..suggest import did_you_mean

    from ..safefiles import path_exists

    hint = "enter a model directory (config.json + weights) or a weights file"
    for path in model_paths:  # a name over the length limit, a NUL: DF004 saying so, never an OSError
        if not path_exists(Path(path).expanduser(), error=ModelLoadingError, hint=hint):
            raise ModelLoadingError("model path does not exist", file=str(path)[:300], hint=hint)
    for file in backend_files:
        path_exists(Path(file).expanduser(), hint="give the path of a Python file that registers backends")
    if backend_files:
        from ..cli.user_code import load_backend_code

        load_backend_code(files=[Path(f).expanduser() for f in backend_files])
    known = registered_backends()
    for role, name in (("reference", reference), ("alternative", alternative)):
        if name in known or (role == "alternative" and name == "auto") or ":" in name:
            continue
        raise BackendInitializationError(f"unknown {role} backend" + did_you_mean(name, known),
                                         hint=f"registered backends: {', '.join(known)}", backend=name)


def _files(backend_files: Sequence[str]) -> list[str]:
    """The backend files of the form, absolute (the worker runs elsewhere), blanks left out."""
    return [str(Path(f.strip()).expanduser().absolute()) for f in backend_files if f.strip()]


def launch_validation(settings: Settings, model_path: str, reference: str, alternative: str,
                      knobs: Mapping[str, object], backend_files: Sequence[str] = ()) -> str:
    """Write a validation task and start its worker; returns the task id (the request is checked
    first: :func:`check_request`)."""
    if not str(model_path).strip():
        raise ConfigurationError("a validation needs a model path", hint="enter the model's directory or file")
    files = _files(backend_files)
    check_request([str(model_path)], reference, alternative, files)
    from ..services.validation.plan import validate_session_config

    config = session_config(knobs)
    validate_session_config(config)  # a bad knob is DF005 here, on the page, not in the worker
    request = {"model_path": str(model_path), "reference_backend": reference, "alternative_backend": alternative,
               "config": config, **({"backend_files": files} if files else {})}
    db, tasks = task_store(settings)
    try:
        tid = tasks.create("validation", request)
        _start_worker(settings, tasks, tid)
    finally:
        db.close()
    return tid


def launch_batch(settings: Settings, model_paths: list[str], reference: str, alternative: str,
                 knobs: Mapping[str, object], backend_files: Sequence[str] = ()) -> str:
    """Write a batch job (its items) and a task for it, start the worker; returns the task id.

    The worker runs the items one after another in its own process (``parallel_execution`` off), so
    a cancel reaches the item that is running."""
    from ..models.batch_validation_job import BatchValidationJob

    paths = [p.strip() for p in model_paths if p.strip()]
    files = _files(backend_files)
    check_request(paths, reference, alternative, files)
    config = {**session_config(knobs), "reference_backend": reference, "alternative_backend": alternative,
              "parallel_execution": False, "database_path": str(settings.database)}
    job = BatchValidationJob(job_id=uuid.uuid4().hex, model_paths=paths, config=config)
    try:
        tasks = TaskStore(job.db)
        tid = tasks.create("batch", {"model_paths": paths, "config": {
            k: v for k, v in config.items() if k != "database_path"}, **({"backend_files": files} if files else {})},
            job_id=job.job_id)
        _start_worker(settings, tasks, tid)
    finally:
        job.db.close()
    return tid


def stored_job(settings: Settings, job_id: str) -> BatchValidationJob:
    """The batch job ``job_id`` as stored (its model paths and options), on this database."""
    from ..models.batch_validation_job import BatchValidationJob

    db = Database(settings.database)
    try:
        row = db.batches.get(job_id)
    finally:
        db.close()
    if row is None:
        raise ConfigurationError(f"no batch job {job_id!r}", hint="pick a job from the list")
    config = {**(row["config"] or {}), "database_path": str(settings.database)}
    return BatchValidationJob(job_id=job_id, model_paths=[i["model_path"] for i in row["items"]], config=config)


def cancel(settings: Settings, task_id: str) -> str:
    """Cancel a task; returns what was done, as a sentence for the page."""
    db, tasks = task_store(settings)
    try:
        row = tasks.request_cancel(task_id)
        if row is None:
            raise ConfigurationError(f"no task {task_id!r}", hint="pick a task from the list")
        task = TaskRecord.from_row(row)
        if task.state not in ACTIVE_STATES:
            return f"the task had already ended ({task.state})"
        if task.kind == "batch" and task.job_id:  # stop handing out items (a worker anywhere)
            _cancel_job(settings, task.job_id)
        if task.state == "queued":
            tasks.finish(task_id, "cancelled", f"{CANCELLED} before its worker started")
            return "cancelled before its worker started"
        if worker_gone(row):
            tasks.finish(task_id, "failed", "its worker process is gone")
            return "its worker process was already gone"
        if task.owner_host != current_owner().host:
            return "cancel requested; the worker runs on another host and stops at its next check"
        if task.owner_pid is None:  # no worker recorded itself: nothing to signal
            return _ended(tasks, task_id)
        try:
            os.kill(task.owner_pid, signal.SIGTERM)
        except ProcessLookupError:  # it exited between the check above and the signal
            return _ended(tasks, task_id)
        return "cancel requested; the worker is stopping"
    finally:
        db.close()


def _cancel_job(settings: Settings, job_id: str) -> None:
    job = stored_job(settings, job_id)
    try:
        job.db.batches.cancel(job.job_id)
    finally:
        job.db.close()


def _ended(tasks: TaskStore, task_id: str) -> str:
    """What to say of a task whose worker exited as it was signalled."""
    row = tasks.get(task_id)
    state = None if row is None else TaskRecord.from_row(row).state
    if row is not None and state in ACTIVE_STATES and worker_gone(row):
        tasks.finish(task_id, "failed", "its worker process is gone")
        return "its worker process was already gone"
    return f"the task had already ended ({state})"
