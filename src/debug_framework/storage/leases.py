"""Ownership leases: which process works on a session or a batch item, and whether it still runs.

One mechanism serves both kinds of row. A row taken for work (a session moved to ``running``, a
batch item claimed) records its owner in the same transaction:

* ``owner_host``: the machine, as host name, boot id and pid namespace (two containers on one
  machine, or one machine before and after a restart, are different hosts);
* ``owner_pid`` and ``owner_token`` (the process's start time), so a reused pid is not taken for the
  owner;
* ``heartbeat_at`` / ``lease_expires_at`` (unix seconds): renewed by a :class:`Heartbeat` thread
  while the owner works.

An owner is *gone* when it ran on this host and its pid is dead, a zombie, or another process
(start time differs); or when it ran on another host and its lease expired (no heartbeat for
``lease_factor`` heartbeat intervals). A live owner on this host is never gone, however old its
heartbeat: a process stopped in a long C call keeps its rows. :func:`sweep` releases the rows of
gone owners: a session becomes ``error`` "abandoned: owner process gone", a batch item goes back to
``pending`` (its job's next run takes it again). Every release is a conditional update on the old
owner, so two sweepers, or a sweeper and a claimer, never act on the same row twice.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache

from ..jsonio import JsonObject
from .core import SqlCore
from .dialect import Connection
from .values import utc_now

__all__ = ["Owner", "current_owner", "process_owner", "owner_gone", "stamp", "renew", "Heartbeat", "holding", "SweepReport",
           "sweep", "live_running_items", "ABANDONED", "LEASE_COLUMNS", "DEFAULT_HEARTBEAT_S", "LEASE_FACTOR", "is_abandoned"]

#: The error message of a session (and the note of a batch item) whose owner is gone.
ABANDONED = "abandoned: owner process gone"
#: The lease columns, the same on ``sessions`` and ``batch_job_items`` (schema version 3).
LEASE_COLUMNS = ("owner_host", "owner_pid", "owner_token", "heartbeat_at", "lease_expires_at")
#: Default heartbeat interval (``config["heartbeat_interval"]``) in seconds.
DEFAULT_HEARTBEAT_S = 30.0
#: A lease lasts this many heartbeat intervals: an owner on another host is gone after that long silent.
LEASE_FACTOR = 4.0

# the leased tables and their key columns: constants, never user input
_KEYS: dict[str, tuple[str, ...]] = {"sessions": ("session_id",), "batch_job_items": ("job_id", "item_index")}


@dataclass(frozen=True)
class Owner:
    """A process that works on rows: where it runs, its pid, and its start time."""

    host: str
    pid: int
    token: str

    def to_dict(self) -> JsonObject:
        return {"owner_host": self.host, "owner_pid": self.pid, "owner_token": self.token}


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of a process from ``/proc`` (Linux), None when it has no entry."""
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return (rest[0], rest[19]) if len(rest) > 19 else None


@cache
def _host_key() -> str:
    """This machine as processes on it see each other: host name, boot id, pid namespace."""
    parts = [socket.gethostname(), _read("/proc/sys/kernel/random/boot_id")]
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "/".join(p for p in parts if p)


def _token(pid: int) -> str:
    stat = _proc_stat(pid) if sys.platform.startswith("linux") else None
    return "" if stat is None else stat[1]


_OWNER: dict[int, Owner] = {}


def current_owner() -> Owner:
    """This process as an owner (recomputed after a fork)."""
    pid = os.getpid()
    owner = _OWNER.get(pid)
    if owner is None:
        owner = _OWNER[pid] = Owner(_host_key(), pid, _token(pid))
    return owner


def process_owner(pid: int) -> Owner:
    """Process ``pid`` of this host as an owner (its start time read now: a child just started)."""
    return Owner(_host_key(), int(pid), _token(int(pid)))


def _pid_runs(pid: int, token: str | None) -> bool:
    """Whether process ``pid`` of this host exists, is not a zombie, and (when known) started at ``token``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    if sys.platform.startswith("linux"):
        stat = _proc_stat(pid)
        if stat is None:
            return True  # /proc hides it (hidepid): the signal check above is all there is
        state, started = stat
        if state in ("Z", "X"):
            return False
        if token and started != token:
            return False  # the pid was reused by another process
    return True


def owner_gone(row: JsonObject, now: float, legacy_after_s: float | None) -> bool:
    """Whether the owner of a ``running`` row is gone (see the module docstring).

    A row without an owner (written before schema version 3) counts as gone once it has not been
    updated for ``legacy_after_s`` seconds (never when None).
    """
    me = current_owner()
    host, pid, token = row.get("owner_host"), row.get("owner_pid"), row.get("owner_token")
    if host is None or pid is None:
        if legacy_after_s is None:
            return False
        updated = _epoch(row.get("updated_at"))
        return updated is not None and now - updated > legacy_after_s
    if host == me.host:
        if int(pid) == me.pid and (token or "") == me.token:
            return False  # our own rows
        return not _pid_runs(int(pid), token)
    expires = row.get("lease_expires_at")
    return expires is not None and now > float(expires)


def _epoch(text: object) -> float | None:
    """A timestamp column as unix seconds (None when absent or unreadable)."""
    from .values import parse_time

    try:
        when = parse_time(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if when is None else when.timestamp()


def _where_key(table: str) -> str:
    return " AND ".join(f"{c} = ?" for c in _KEYS[table])  # names from the constant table above


def _clock(core: SqlCore, conn: Connection | None = None) -> float:
    """Now, by the database's clock where it has one (a server shared by several hosts: one clock
    for every lease, so a machine whose clock runs ahead never sweeps live owners elsewhere);
    this machine's clock for SQLite, whose file never leaves the host."""
    sql = getattr(core.dialect, "clock_sql", None)
    if sql is None:
        return time.time()
    if conn is not None:
        return float(core.execute(conn, sql, ()).fetchone()[0])
    return float(core.read(lambda c: core.execute(c, sql, ()).fetchone()[0], "read the database clock"))


def stamp(core: SqlCore, conn: Connection, table: str, key: tuple[object, ...]) -> None:
    """Record this process as the owner of one row (inside the caller's transaction); the lease
    lasts :data:`LEASE_FACTOR` intervals of the heartbeat this process holds on the database."""
    owner, now = current_owner(), _clock(core, conn)
    beat = _BEATS.get((owner.pid, core.location))
    interval_s = beat.interval_s if beat is not None else DEFAULT_HEARTBEAT_S
    core.execute(
        conn,
        f"UPDATE {table} SET owner_host = ?, owner_pid = ?, owner_token = ?, heartbeat_at = ?,"
        f" lease_expires_at = ? WHERE {_where_key(table)}",
        (owner.host, owner.pid, owner.token, now, now + LEASE_FACTOR * interval_s, *key),
    )


def renew(core: SqlCore, interval_s: float) -> int:
    """Renew the lease of every running row this process owns; returns how many rows."""
    owner = current_owner()

    def do(c: Connection) -> int:
        n, now = 0, _clock(core, c)
        for table in _KEYS:
            n += core.execute(
                c,
                f"UPDATE {table} SET heartbeat_at = ?, lease_expires_at = ?"
                " WHERE status = 'running' AND owner_host = ? AND owner_pid = ? AND owner_token = ?",
                (now, now + LEASE_FACTOR * interval_s, owner.host, owner.pid, owner.token),
            ).rowcount
        return n

    return core.run_in_transaction(do, "renew the leases of this process")


class Heartbeat:
    """The thread renewing this process's leases in one database file: at once when a holder
    arrives, then every ``interval_s`` while anyone holds it (:func:`holding`). When the last holder
    leaves, the thread ends and closes its connection; the next holder starts a new one.

    One per (process, file), with a connection of its own (a caller closing its database does not
    stop the heartbeat)."""

    def __init__(self, core: SqlCore, interval_s: float) -> None:
        self._source = core
        self.interval_s = float(interval_s)
        self._holders = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        with self._cond:
            self._holders += 1
            if self._thread is None:
                src = self._source
                core = SqlCore(src.database_path, busy_timeout_s=src.busy_timeout_s, max_retry_s=src.max_retry_s,
                               dialect=src.dialect)
                self._thread = threading.Thread(target=self._loop, args=(core,), name="pie-debug-heartbeat",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()  # renew now: the lease stamped at the claim has the default length

    def release(self) -> None:
        with self._cond:
            self._holders = max(0, self._holders - 1)
            self._cond.notify_all()  # the last holder gone: the thread ends now, not an interval later

    def _loop(self, core: SqlCore) -> None:
        try:
            while True:
                with self._cond:
                    if self._holders == 0:
                        self._thread = None
                        return
                with contextlib.suppress(Exception):  # a busy or full database must not kill the worker
                    renew(core, self.interval_s)
                with self._cond:
                    if self._holders:
                        self._cond.wait(self.interval_s)
        finally:
            core.close()


_BEATS: dict[tuple[int, str], Heartbeat] = {}
_BEATS_LOCK = threading.Lock()


@contextlib.contextmanager
def holding(core: SqlCore, interval_s: float = DEFAULT_HEARTBEAT_S) -> Iterator[None]:
    """Keep this process's leases in ``core``'s database alive while the block runs."""
    key = (os.getpid(), core.location)
    with _BEATS_LOCK:
        beat = _BEATS.get(key)
        if beat is None or beat.interval_s != float(interval_s):
            beat = _BEATS[key] = Heartbeat(core, interval_s)
    beat.acquire()
    try:
        yield
    finally:
        beat.release()


@dataclass
class SweepReport:
    """What :func:`sweep` released (or, in a dry run, would release)."""

    sessions: list[str] = field(default_factory=list)
    items: list[tuple[str, int]] = field(default_factory=list)

    def to_dict(self) -> JsonObject:
        return {"abandoned_sessions": list(self.sessions),
                "requeued_items": [{"job_id": j, "item_index": i} for j, i in self.items]}


def _running(core: SqlCore, table: str, job_id: str | None) -> list[JsonObject]:
    cols = ", ".join((*_KEYS[table], *LEASE_COLUMNS, "updated_at"))
    sql = f"SELECT {cols} FROM {table} WHERE status = 'running'"
    params: tuple[object, ...] = ()
    if job_id is not None and table == "batch_job_items":
        sql, params = sql + " AND job_id = ?", (job_id,)
    return [dict(r) for r in core.fetch_all(sql, params, f"find running rows of {table}")]


def _release(core: SqlCore, table: str, row: JsonObject) -> bool:
    """Release one row of a gone owner, only if that owner still holds it."""
    key = tuple(row[c] for c in _KEYS[table])
    owner = (row["owner_host"], row["owner_pid"], row["owner_token"])
    iso = utc_now()
    if table == "sessions":
        sql = ("UPDATE sessions SET status = 'error', error_message = ?, finished_at = ?, updated_at = ?"
               f" WHERE {_where_key(table)} AND status = 'running'"
               " AND owner_host IS ? AND owner_pid IS ? AND owner_token IS ?")
        params: tuple[object, ...] = (ABANDONED, iso, iso, *key, *owner)
    else:
        sql = ("UPDATE batch_job_items SET status = 'pending', error_message = ?, updated_at = ?"
               f" WHERE {_where_key(table)} AND status = 'running'"
               " AND owner_host IS ? AND owner_pid IS ? AND owner_token IS ?")
        params = (f"{ABANDONED} (requeued)", iso, *key, *owner)
    n = core.run_in_transaction(lambda c: core.execute(c, sql, params).rowcount, f"release a row of {table}")
    return n == 1


def sweep(core: SqlCore, *, dry_run: bool = False, legacy_after_s: float | None = None,
          job_id: str | None = None) -> SweepReport:
    """Release every running session and batch item (only ``job_id``'s items, and no sessions,
    when given) whose owner is gone; ``dry_run`` lists them and changes nothing."""
    now, report = _clock(core), SweepReport()
    tables = ("batch_job_items",) if job_id is not None else ("sessions", "batch_job_items")
    for table in tables:
        for row in _running(core, table, job_id):
            if not owner_gone(row, now, legacy_after_s):
                continue
            if dry_run or _release(core, table, row):
                if table == "sessions":
                    report.sessions.append(str(row["session_id"]))
                else:
                    report.items.append((str(row["job_id"]), int(row["item_index"])))
    return report


def live_running_items(core: SqlCore, job_id: str) -> int:
    """How many of ``job_id``'s items are running under an owner that is not gone (an item without
    an owner, claimed before schema version 3, counts as gone)."""
    now = _clock(core)
    return sum(not owner_gone(row, now, 0.0) for row in _running(core, "batch_job_items", job_id))


def is_abandoned(error_message: str | None) -> bool:
    """Whether a session's error says its owner was gone (so its work can be run again)."""
    return bool(error_message) and str(error_message).startswith(ABANDONED)
