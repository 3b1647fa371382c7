"""The batch queue (``batch_jobs`` / ``batch_job_items``): resumable jobs whose items workers claim
atomically, so several processes can drain one job without running an item twice."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from ..jsonio import JsonObject
from ..errors import ConfigurationError, DatabaseError
from .core import Row, SqlCore
from .dialect import Connection
from .leases import current_owner, stamp
from .schema import BATCH_ITEM_STATUSES, BATCH_JOB_STATUSES
from .values import decode_json_columns, to_json, utc_now

__all__ = ["BatchQueueStore"]


class BatchQueueStore:
    """Batch jobs and their items (one per model path)."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def create(self, model_paths: Sequence[str], config: Mapping[str, object] | None = None,
               *, job_id: str | None = None) -> str:
        """Create a job with one pending item per model path. Re-creating an existing job id is a
        no-op (so a restarted job resumes its items)."""
        jid = job_id or uuid.uuid4().hex

        def do(c: Connection) -> None:
            now = utc_now()
            if self.core.execute(c, "SELECT 1 FROM batch_jobs WHERE job_id = ?", (jid,)).fetchone():
                return
            self.core.execute(c, "INSERT INTO batch_jobs (job_id, config, status, created_at, updated_at)"
                                 " VALUES (?,?,?,?,?)", (jid, to_json(dict(config or {})), "pending", now, now))
            self.core.executemany(
                c, "INSERT INTO batch_job_items (job_id, item_index, model_path, status, updated_at) VALUES (?,?,?,?,?)",
                [(jid, i, str(p), "pending", now) for i, p in enumerate(model_paths)],
            )

        self.core.run_in_transaction(do, f"create batch job {jid}")
        return jid

    def get(self, job_id: str) -> JsonObject | None:
        """The job row (``config`` decoded) with its ``items`` in order, or None."""
        def rd(c: Connection) -> tuple[Row | None, list[Row]]:
            job = self.core.execute(c, "SELECT * FROM batch_jobs WHERE job_id = ?", (job_id,)).fetchone()
            items = self.core.execute(c, "SELECT * FROM batch_job_items WHERE job_id = ? ORDER BY item_index",
                                      (job_id,)).fetchall()
            return job, items

        job, items = self.core.read(rd, f"read batch job {job_id}")
        if job is None:
            return None
        d = decode_json_columns(dict(job), ("config",))
        d["items"] = [dict(i) for i in items]
        return d

    def list(self, limit: int = 50) -> list[JsonObject]:
        """Jobs, newest first, each with its item counts by status (``counts``) and ``total``."""
        rows = self.core.fetch_all(
            "SELECT j.job_id, j.status, j.created_at, j.updated_at, i.status AS item_status, COUNT(i.item_index) AS n"
            " FROM batch_jobs j LEFT JOIN batch_job_items i ON i.job_id = j.job_id"
            " GROUP BY j.job_id, j.status, j.created_at, j.updated_at, i.status"
            " ORDER BY j.created_at DESC, j.job_id", (), "list batch jobs")
        jobs: dict[str, JsonObject] = {}
        for r in rows:
            job = jobs.setdefault(r["job_id"], {"job_id": r["job_id"], "status": r["status"], "created_at": r["created_at"],
                                                "updated_at": r["updated_at"], "counts": {}, "total": 0})
            if r["item_status"] is not None:
                job["counts"][r["item_status"]] = int(r["n"])
                job["total"] += int(r["n"])
        return list(jobs.values())[: int(limit)]

    def set_status(self, job_id: str, status: str) -> None:
        """Set the job's status (one of :data:`~.schema.BATCH_JOB_STATUSES`)."""
        if status not in BATCH_JOB_STATUSES:
            raise ConfigurationError(f"unknown batch job status {status!r}", hint=f"use one of {BATCH_JOB_STATUSES}")
        self.core.run_in_transaction(
            lambda c: self.core.execute(c, "UPDATE batch_jobs SET status = ?, updated_at = ? WHERE job_id = ?",
                                        (status, utc_now(), job_id)),
            f"update batch job {job_id}",
        )

    def update_item(self, job_id: str, item_index: int, *, status: str, session_id: str | None = None,
                    error_message: str | None = None, if_owned: bool = False) -> bool:
        """Record an item's progress; ``session_id`` links the finished session (same transaction).

        With ``if_owned``, only while this process still holds the item's lease: returns False
        (and changes nothing) when a sweep gave the item to another owner meanwhile."""
        if status not in BATCH_ITEM_STATUSES:
            raise ConfigurationError(f"unknown batch item status {status!r}", hint=f"use one of {BATCH_ITEM_STATUSES}")
        owner = current_owner()
        mine = " AND status = 'running' AND owner_host = ? AND owner_pid = ? AND owner_token = ?" if if_owned else ""
        extra: tuple[object, ...] = (owner.host, owner.pid, owner.token) if if_owned else ()

        def do(c: Connection) -> bool:
            n = self.core.execute(
                c,
                "UPDATE batch_job_items SET status = ?, session_id = COALESCE(?, session_id), error_message = ?,"
                " updated_at = ? WHERE job_id = ? AND item_index = ?" + mine,
                (status, session_id, error_message, utc_now(), job_id, int(item_index), *extra),
            ).rowcount
            if n != 1 and not if_owned:
                raise DatabaseError(f"batch job {job_id!r} has no item {item_index}",
                                    database=self.core.location)
            return n == 1

        return self.core.run_in_transaction(do, f"update batch job {job_id} item {item_index}")

    def progress(self, job_id: str) -> JsonObject:
        """The job's progress: ``job_id``, ``status`` (None for an unknown job), ``total``, one count
        per item status (:data:`~.schema.BATCH_ITEM_STATUSES`), ``finished`` (done + failed) and
        ``percent`` (100 for a job without items)."""
        job = self.get(job_id)
        items = job["items"] if job else []
        counts = dict.fromkeys(BATCH_ITEM_STATUSES, 0)
        for item in items:
            counts[item["status"]] = counts.get(item["status"], 0) + 1
        finished = counts["done"] + counts["failed"]
        total = len(items)
        return {"job_id": job_id, "status": job["status"] if job else None, "total": total, **counts,
                "finished": finished, "percent": 100.0 * finished / total if total else 100.0}

    def cancel(self, job_id: str) -> None:
        """Stop handing out the job's items: the job and its pending items become ``cancelled``, in
        one transaction (items a worker runs finish; executing the job again resumes it)."""
        def do(c: Connection) -> None:
            now = utc_now()
            self.core.execute(c, "UPDATE batch_jobs SET status = 'cancelled', updated_at = ? WHERE job_id = ?",
                              (now, job_id))
            self.core.execute(c, "UPDATE batch_job_items SET status = 'cancelled', updated_at = ?"
                                 " WHERE job_id = ? AND status = 'pending'", (now, job_id))

        self.core.run_in_transaction(do, f"cancel batch job {job_id}")

    def claim_item(self, job_id: str) -> JsonObject | None:
        """Atomically take the next pending item of a job (status -> running); None when none is left."""

        def do(c: Connection) -> JsonObject | None:
            # one statement on both engines (UPDATE ... RETURNING): the row changes to running as it
            # is read, inside the write transaction, so two claimers never get the same item
            row = self.core.execute(
                c, "UPDATE batch_job_items SET status = 'running', updated_at = ?"
                   " WHERE job_id = ? AND status = 'pending' AND item_index = (SELECT MIN(item_index)"
                   " FROM batch_job_items WHERE job_id = ? AND status = 'pending') RETURNING *",
                (utc_now(), job_id, job_id),
            ).fetchone()
            if row is None:
                return None
            d = dict(row)
            stamp(self.core, c, "batch_job_items", (job_id, d["item_index"]))  # owner and heartbeat lease
            return d

        return self.core.run_in_transaction(do, f"claim an item of batch job {job_id}")
