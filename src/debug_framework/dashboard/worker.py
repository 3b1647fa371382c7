"""The worker process of a task launched from the dashboard.

    python -m debug_framework.dashboard.worker --task TASK_ID

The database comes from the environment (``PIE_DEBUG_DATABASE``, set by :mod:`.launch`). The worker
takes the ``queued`` task (recording itself as its owner), then runs it:

* a validation: ``ValidationEngine.create_session`` then ``run``, writing each finished stage to the
  task (``stage``, ``done``, ``total``) for the page to poll;
* a batch job: the job's executor, writing the item counts to the task.

SIGTERM (the dashboard's Cancel) raises :class:`Cancelled` in the worker's main thread, where the
work runs (and again every 2 s until the work has stopped, since Python drops an exception raised
while a finaliser runs); a cancel is also checked between stages, where the task's
``cancel_requested`` flag is read from the database too (a dashboard on another host cannot signal
this process). A resent cancel that lands in the engine's own failure handling is caught up with:
a session still ``running`` when the cancel reaches the worker ends ``error`` "cancelled". The engine ends the running
session as ``error`` with the message "cancelled from the dashboard" and keeps its rows; the task
ends ``cancelled``. Exit codes: 0 the task ran (whatever
its verdict) or was not ours to run; 2 the request failed (a DF-coded error, recorded on the task);
3 a bug of ours (recorded on the task, traceback on stderr, i.e. in the task's log file).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from ..errors import DebugFrameworkError
from ..jsonio import JsonObject
from ..storage.tasks import TaskRecord, TaskStore
from .launch import CANCELLED, stored_job
from .settings import Settings, resolve_database

__all__ = ["Cancelled", "main", "run_task"]


class Cancelled(BaseException):
    """The dashboard cancelled the task (a BaseException, so no ``except Exception`` on the way
    swallows it); sessions record :attr:`failure_message`."""

    failure_message = CANCELLED


#: ``working``: inside the engine or the executor (a SIGTERM raises there); ``requested``: a cancel arrived.
_STATE = {"working": False, "requested": False, "resending": False}
_RESEND_S = 2.0


def _resend_while_working() -> None:
    """Signal this process again every :data:`_RESEND_S` while the work has not stopped: an
    exception raised by a signal handler while Python runs a finaliser (``__del__``, a weakref
    callback) is printed and dropped, so one delivery is not enough."""
    if _STATE["resending"]:
        return
    _STATE["resending"] = True

    def resend() -> None:
        while True:
            time.sleep(_RESEND_S)
            if not _STATE["working"]:
                return
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=resend, name="dashboard-cancel", daemon=True).start()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _STATE["requested"] = True
    if _STATE["working"]:
        _resend_while_working()
        raise Cancelled()


@contextmanager
def _cancellable() -> Iterator[None]:
    """The block a cancel interrupts (outside it, a cancel is only noted and acted on at its start)."""
    if _STATE["requested"]:
        raise Cancelled()
    _STATE["working"] = True
    try:
        yield
    finally:
        _STATE["working"] = False


def _check_cancel() -> None:
    """A safe point (between two stages): stop here when a cancel arrived."""
    if _STATE["requested"]:
        raise Cancelled()


def _check_flag(tasks: TaskStore, task_id: str) -> None:
    """Note a cancel requested in the database (the dashboard may run on another host, where its
    signal cannot reach this process); in the main thread, stop here."""
    if not _STATE["requested"] and tasks.cancel_requested(task_id):
        _STATE["requested"] = True
    if threading.current_thread() is threading.main_thread():
        _check_cancel()


def _run_validation(settings: Settings, tasks: TaskStore, task: JsonObject) -> None:
    from ..config import from_environment, merge_config
    from ..services.validation_engine import ValidationEngine

    record = TaskRecord.from_row(task)
    req = record.request
    engine = ValidationEngine(settings.database, config=merge_config(from_environment()))
    tid, sid = task["task_id"], uuid.uuid4().hex

    def progress(stage: str, done: int, total: int) -> None:
        tasks.update(tid, stage=stage, done=done, total=total)
        _check_flag(tasks, tid)

    tasks.update(tid, stage="load", done=0, total=None)
    try:
        with _cancellable():
            engine.create_session(str(req["model_path"]), record.config,
                                  record.asked("reference_backend", "python_reference"),
                                  record.asked("alternative_backend", "auto"), session_id=sid)
            tasks.update(tid, session_id=sid)
            engine.run(sid, progress=progress)
    except Cancelled:
        row = engine.db.sessions.get(sid)
        if row is not None and row["status"] in ("passed", "failed"):
            return  # the session had ended when the cancel arrived: the task finished, its verdict stands
        if row is not None and row["status"] in ("created", "running"):
            # not started, or a resent cancel landed in the engine's own failure handling: end it as
            # the engine would (nothing works on it any more: `working` is false here)
            engine.db.sessions.update_status(sid, "error", error_message=CANCELLED)
            tasks.update(tid, session_id=sid)
        raise


def _run_batch(settings: Settings, tasks: TaskStore, task: JsonObject) -> None:
    from ..services.executors import execute_job

    job = stored_job(settings, str(task["job_id"]))
    tid = task["task_id"]

    def progress(prog: JsonObject) -> None:  # called from the executor's follower thread too
        tasks.update(tid, stage=str(prog.get("status")), done=int(prog["finished"]), total=int(prog["total"]))
        _check_flag(tasks, tid)

    try:
        with _cancellable():
            execute_job(job, progress=progress)
        _check_cancel()  # a cancel that arrived as the last model finished
    except Cancelled:  # the item that ran went back to pending: cancelled like the rest
        job.db.batches.cancel(job.job_id)
        raise
    finally:
        progress(job.db.batches.progress(job.job_id))
        job.db.close()


def run_task(settings: Settings, task_id: str) -> int:
    """Run the task ``task_id`` to its end; returns the exit code (see the module doc)."""
    from ..storage.database import Database

    signal.signal(signal.SIGTERM, _on_sigterm)  # before taking the task: a cancel from now on stops us
    db = Database(settings.database)
    tasks = TaskStore(db)
    if not tasks.start(task_id):
        return 0  # cancelled before we started, or another worker took it
    task = tasks.get(task_id)
    assert task is not None
    try:
        files = TaskRecord.from_row(task).backend_files
        if files:  # the form's backend files register their backends here too, as --backend-file does
            from ..cli.user_code import load_backend_code

            load_backend_code(files=[Path(f) for f in files])
        (_run_batch if task["kind"] == "batch" else _run_validation)(settings, tasks, task)
    except Cancelled:
        tasks.finish(task_id, "cancelled", CANCELLED)
        return 0
    except DebugFrameworkError as exc:
        tasks.finish(task_id, "failed", str(exc))
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug of ours: recorded on the task, traceback in the log
        traceback.print_exc()
        tasks.finish(task_id, "failed", f"internal error (a bug of the framework): {type(exc).__name__}: {exc}")
        return 3
    tasks.finish(task_id, "finished")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m debug_framework.dashboard.worker",
                                     description="Run one task launched from the dashboard.")
    parser.add_argument("--task", required=True, help="the task id (dashboard_tasks.task_id)")
    args = parser.parse_args(argv)
    try:
        settings = Settings(database=resolve_database(None), artifacts=Settings.from_environment().artifacts)
        return run_task(settings, args.task)
    except DebugFrameworkError as exc:  # before the task was taken (the database cannot be opened)
        print(f"worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
