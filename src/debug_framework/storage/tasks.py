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
from typing import Any

from ..errors import ConfigurationError
from .core import SqlCore
from .dialect import Connection, Dialect
from .leases import Owner, current_owner, owner_gone
from .values import decode_json_columns, to_json, utc_now

__all__ = ["TaskStore", "task_tables", "worker_gone", "TASK_KINDS", "TASK_STATES", "ACTIVE_STATES"]

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


class TaskStore:
    """Launched tasks by id: request, owner, progress, outcome, cancel flag."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def create(self, kind: str, request: Mapping[str, Any], *, job_id: str | None = None) -> str:
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

    def get(self, task_id: str) -> dict[str, Any] | None:
        row = self.core.fetch_one("SELECT * FROM dashboard_tasks WHERE task_id = ?", (task_id,), f"read task {task_id}")
        return None if row is None else decode_json_columns(dict(row), ("request",))

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
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

    def update(self, task_id: str, **fields: Any) -> None:
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

    def request_cancel(self, task_id: str) -> dict[str, Any] | None:
        """Flag the task for cancelling and return it as it is now (None: no such task)."""
        self.core.run_in_transaction(
            lambda c: self.core.execute(c, "UPDATE dashboard_tasks SET cancel_requested = 1, updated_at = ?"
                                           " WHERE task_id = ?", (utc_now(), task_id)), f"cancel task {task_id}")
        return self.get(task_id)


def worker_gone(task: Mapping[str, Any]) -> bool:
    """Whether an active task's worker process is gone (dead, a zombie, or its pid reused): the
    worker that runs it, or for a ``queued`` task the one started for it (:meth:`TaskStore.record_spawn`)."""
    return task.get("state") in ACTIVE_STATES and owner_gone(dict(task), time.time(), None)
