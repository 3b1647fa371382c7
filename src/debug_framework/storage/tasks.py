"""Launched work (``dashboard_tasks``, schema version 5): a validation or a batch job that the
dashboard asked for and a separate worker process runs.

A task is written before its worker starts, so the request, its progress (stage, done, total), its
outcome and a cancel request live in the database, never in a browser session: a page that is
reloaded reads them back. The worker records itself as the task's owner (host, pid, start time: the
same :class:`~.leases.Owner` as running sessions), so whether it still runs is answered by
:func:`~.leases.owner_gone`, and a cancel signals only that very process.

Task states: ``queued`` (written, no worker yet), ``running``, ``finished`` (the work ended; the
session's or job's own status says how), ``cancelled``, ``failed`` (the worker could not do the
work: the message says why).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..jsonio import JsonObject, JsonValue

from ..errors import ConfigurationError
from .core import SqlCore
from .dialect import Connection, Dialect
from .leases import Owner, current_owner, owner_gone
from .values import decode_json_columns, to_json, utc_now

__all__ = ["TaskStore", "TaskRecord", "task_tables", "worker_gone", "TASK_KINDS", "TASK_STATES", "ACTIVE_STATES"]

TASK_KINDS = ("validation", "batch")
TASK_STATES = ("queued", "running", "finished", "cancelled", "failed")
ACTIVE_STATES = ("queued", "running")
_COLUMNS = ("session_id", "job_id", "stage", "done", "total", "message")


def task_tables(d: Dialect) -> tuple[str, ...]:
    """Version 5's new table and index."""
    j = d.json_type
    kinds = ", ".join(f"'{k}'" for k in TASK_KINDS)
    states = ", ".join(f"'{s}'" for s in TASK_STATES)
    return (
        f"""CREATE TABLE dashboard_tasks (
        task_id          TEXT PRIMARY KEY,
        kind             TEXT NOT NULL CHECK (kind IN ({kinds})),
        request          {j} NOT NULL,
        state            TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ({states})),
        session_id       TEXT,
        job_id           TEXT,
        stage            TEXT,
        done             INTEGER,
        total            INTEGER,
        message          TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        owner_host       TEXT,
        owner_pid        INTEGER,
        owner_token      TEXT,
        created_at       TEXT NOT NULL,
        updated_at       TEXT NOT NULL
    )""",
        "CREATE INDEX IF NOT EXISTS idx_dashboard_tasks_created ON dashboard_tasks(created_at)",
    )


def _opt_int(value: JsonValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: JsonValue) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class TaskRecord:
    """One ``dashboard_tasks`` row as the pages show it (defaults decided here once)."""

    task_id: str
    kind: str
    state: str
    request: JsonObject = field(default_factory=dict)
    session_id: str | None = None
    job_id: str | None = None
    stage: str | None = None
    done: int = 0
    total: int = 0
    message: str | None = None
    cancel_requested: bool = False
    created_at: str = ""
    owner_host: str | None = None
    owner_pid: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, JsonValue]) -> TaskRecord:
        """The record of a row as :meth:`TaskStore.get` / :meth:`TaskStore.list` return it."""
        request = row.get("request")
        return cls(task_id=str(row["task_id"]), kind=str(row["kind"]), state=str(row["state"]),
                   request=dict(request) if isinstance(request, Mapping) else {},
                   session_id=_opt_str(row.get("session_id")) or None, job_id=_opt_str(row.get("job_id")) or None,
                   stage=_opt_str(row.get("stage")), done=_opt_int(row.get("done")) or 0,
                   total=_opt_int(row.get("total")) or 0, message=_opt_str(row.get("message")),
                   cancel_requested=bool(row.get("cancel_requested")), created_at=str(row.get("created_at") or ""),
                   owner_host=_opt_str(row.get("owner_host")), owner_pid=_opt_int(row.get("owner_pid")))

    def asked(self, key: str, default: str) -> str:
        """A text field of the request (``reference_backend``, ``alternative_backend``), else ``default``."""
        value = self.request.get(key)
        return default if value is None else str(value)

    @property
    def config(self) -> JsonObject:
        """The session configuration the request asks for ({} for none)."""
        cfg = self.request.get("config")
        return dict(cfg) if isinstance(cfg, Mapping) else {}

    @property
    def backend_files(self) -> list[str]:
        """The files that register the request's backends (``--backend-file``)."""
        files = self.request.get("backend_files")
        return [str(f) for f in files] if isinstance(files, list) else []

    @property
    def what(self) -> str:
        """What the task validates: its model path, or how many models its batch holds."""
        model, models = self.request.get("model_path"), self.request.get("model_paths")
        return str(model) if model else f"{len(models) if isinstance(models, list) else 0} models"


class TaskStore:
    """Launched tasks by id: request, owner, progress, outcome, cancel flag."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def create(self, kind: str, request: Mapping[str, object], *, job_id: str | None = None) -> str:
        """Write a ``queued`` task and return its id."""
        if kind not in TASK_KINDS:
            raise ConfigurationError(f"unknown task kind {kind!r}", hint=f"use one of {', '.join(TASK_KINDS)}")
        tid = uuid.uuid4().hex
        now = utc_now()
        self.core.run_in_transaction(
            lambda c: self.core.execute(
                c, "INSERT INTO dashboard_tasks (task_id, kind, request, state, job_id, created_at, updated_at)"
                   " VALUES (?,?,?,?,?,?,?)", (tid, kind, to_json(dict(request)), "queued", job_id, now, now)),
            f"create task {tid}")
        return tid

    def get(self, task_id: str) -> JsonObject | None:
        row = self.core.fetch_one("SELECT * FROM dashboard_tasks WHERE task_id = ?", (task_id,), f"read task {task_id}")
        return None if row is None else decode_json_columns(dict(row), ("request",))

    def list(self, limit: int = 50) -> list[JsonObject]:
        """Tasks, newest first."""
        rows = self.core.fetch_all("SELECT * FROM dashboard_tasks ORDER BY created_at DESC, task_id LIMIT ?",
                                   (int(limit),), "list tasks")
        return [decode_json_columns(dict(r), ("request",)) for r in rows]

    def start(self, task_id: str) -> bool:
        """This process takes a ``queued`` task (state ``running``, owner recorded); False when the
        task is not queued any more (cancelled before the worker got to it, or taken)."""
        owner = current_owner()

        def do(c: Connection) -> bool:
            n = self.core.execute(
                c, "UPDATE dashboard_tasks SET state = 'running', owner_host = ?, owner_pid = ?, owner_token = ?,"
                   " updated_at = ? WHERE task_id = ? AND state = 'queued' AND cancel_requested = 0",
                (owner.host, owner.pid, owner.token, utc_now(), task_id)).rowcount
            return n == 1

        return self.core.run_in_transaction(do, f"start task {task_id}")

    def record_spawn(self, task_id: str, owner: Owner) -> None:
        """Record the worker process just started for a ``queued`` task as its owner, so a worker
        that dies before taking the task reads as gone (:func:`worker_gone`) instead of queued forever."""
        self.core.run_in_transaction(
            lambda c: self.core.execute(
                c, "UPDATE dashboard_tasks SET owner_host = ?, owner_pid = ?, owner_token = ?, updated_at = ?"
                   " WHERE task_id = ? AND state = 'queued'", (owner.host, owner.pid, owner.token, utc_now(), task_id)),
            f"record the worker of task {task_id}")

    def cancel_requested(self, task_id: str) -> bool:
        """Whether a cancel was requested for the task (the flag any host can set)."""
        row = self.core.fetch_one("SELECT cancel_requested FROM dashboard_tasks WHERE task_id = ?", (task_id,),
                                  f"read task {task_id}")
        return bool(row is not None and dict(row)["cancel_requested"])

    def update(self, task_id: str, **fields: object) -> None:
        """Record progress or links (``session_id``, ``job_id``, ``stage``, ``done``, ``total``, ``message``)."""
        unknown = set(fields) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"not task columns: {sorted(unknown)}")
        cols = [c for c in _COLUMNS if c in fields]  # names from _COLUMNS, values as parameters
        sql = "UPDATE dashboard_tasks SET " + ", ".join(f"{c} = ?" for c in cols) + ", updated_at = ? WHERE task_id = ?"
        self.core.run_in_transaction(
            lambda c: self.core.execute(c, sql, (*[fields[k] for k in cols], utc_now(), task_id)),
            f"update task {task_id}")

    def finish(self, task_id: str, state: str, message: str | None = None) -> None:
        """End a task (``finished``, ``cancelled`` or ``failed``) unless it already ended."""
        if state not in TASK_STATES or state in ACTIVE_STATES:
            raise ConfigurationError(f"a task cannot end as {state!r}")
        self.core.run_in_transaction(
            lambda c: self.core.execute(
                c, "UPDATE dashboard_tasks SET state = ?, message = COALESCE(?, message), updated_at = ?"
                   " WHERE task_id = ? AND state IN ('queued', 'running')", (state, message, utc_now(), task_id)),
            f"finish task {task_id}")

    def request_cancel(self, task_id: str) -> JsonObject | None:
        """Flag the task for cancelling and return it as it is now (None: no such task)."""
        self.core.run_in_transaction(
            lambda c: self.core.execute(c, "UPDATE dashboard_tasks SET cancel_requested = 1, updated_at = ?"
                                           " WHERE task_id = ?", (utc_now(), task_id)), f"cancel task {task_id}")
        return self.get(task_id)


def worker_gone(task: Mapping[str, object]) -> bool:
    """Whether an active task's worker process is gone (dead, a zombie, or its pid reused): the
    worker that runs it, or for a ``queued`` task the one started for it (:meth:`TaskStore.record_spawn`)."""
    return task.get("state") in ACTIVE_STATES and owner_gone(dict(task), time.time(), None)
