"""The ``sessions`` table: one row per validation session, its provenance and its status."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, Unpack

from ..jsonio import JsonObject
from ..config import check_keywords
from ..errors import ConfigurationError, DatabaseError, ValidationError
from .core import Row, SqlCore
from .dialect import Connection
from .leases import stamp
from .schema import SESSION_STATUSES
from .values import as_int, check_session_id, decode_json_columns, to_json, utc_now

__all__ = ["SessionStore", "model_path_key", "SessionProvenance", "SessionFilter", "STATUS_TRANSITIONS", "TERMINAL_STATUSES", "SESSION_MUTABLE", "SESSION_JSON"]

#: Allowed status changes. Terminal states (passed/failed/error) never change again.
STATUS_TRANSITIONS: dict[str, frozenset[str]] = {
    "created": frozenset({"running", "error"}),
    "running": frozenset({"passed", "failed", "error"}),
    "passed": frozenset(),
    "failed": frozenset(),
    "error": frozenset(),
}
TERMINAL_STATUSES = frozenset({"passed", "failed", "error"})
#: Columns :meth:`SessionStore.update` may change (a whitelist: column names are never user input).
SESSION_MUTABLE = (
    "model_path", "weights_digest", "reference_backend", "reference_backend_info", "alternative_backend",
    "alternative_backend_info", "config", "tolerances", "seed", "inputs_ref", "environment", "results",
)
#: Columns holding JSON documents.
SESSION_JSON = frozenset({"reference_backend_info", "alternative_backend_info", "config", "tolerances",
                          "environment", "results"})
_FILTERS = ("model_path", "status", "reference_backend", "alternative_backend")


class SessionProvenance(TypedDict, total=False):
    """Optional columns of a new session (what ran, how, where)."""

    config: Mapping[str, object] | None
    session_id: str | None
    weights_digest: str | None
    reference_backend_info: Mapping[str, object] | None
    alternative_backend_info: Mapping[str, object] | None
    tolerances: Mapping[str, object] | None
    seed: int | None
    inputs_ref: str | None
    environment: Mapping[str, object] | None
    created_at: str | None


class SessionFilter(TypedDict, total=False):
    """Which sessions :meth:`SessionStore.list` returns (every given column must match) and how many."""

    model_path: str | None
    status: str | None
    reference_backend: str | None
    alternative_backend: str | None
    limit: int | None


def session_from_row(row: Row) -> JsonObject:
    """A session row as a dict, JSON columns decoded (damaged ones None, named in ``damaged_json``)."""
    return decode_json_columns(dict(row), sorted(SESSION_JSON))


def model_path_key(model_path: str) -> str:
    """A model path as sessions store it: absolute and resolved (``~`` expanded), so a session can be
    found, listed and reproduced from any directory."""
    return str(Path(model_path).expanduser().resolve())


class SessionStore:
    """Sessions: create, update provenance/results, move status (validated), read, list, delete."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def _missing(self, session_id: str) -> DatabaseError:
        return DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                             database=self.core.location, hint="create the session first")

    def require(self, conn: Connection, session_id: str) -> None:
        """Raise DatabaseError (inside the caller's transaction) when the session does not exist."""
        if self.core.execute(conn, "SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
            raise self._missing(session_id)

    def touch(self, conn: Connection, session_id: str) -> None:
        """Mark the session updated now (inside the caller's transaction)."""
        self.core.execute(conn, "UPDATE sessions SET updated_at = ? WHERE session_id = ?", (utc_now(), session_id))

    def create(self, model_path: str, reference_backend: str, alternative_backend: str,
               **provenance: Unpack[SessionProvenance]) -> str:
        """Insert a session in status ``created``; returns its id (a new uuid4 hex unless given)."""
        check_keywords(provenance, SessionProvenance, "create_session")
        p = provenance
        sid = check_session_id(p["session_id"]) if p.get("session_id") else uuid.uuid4().hex  # ids name files
        now = utc_now()
        params = (
            sid, str(model_path), p.get("weights_digest"), str(reference_backend),
            to_json(p.get("reference_backend_info")), str(alternative_backend),
            to_json(p.get("alternative_backend_info")), to_json(dict(p.get("config") or {})),
            to_json(p.get("tolerances")), as_int(p.get("seed")), p.get("inputs_ref"), to_json(p.get("environment")),
            "created", p.get("created_at") or now, now,
        )
        self.core.run_in_transaction(
            lambda c: self.core.execute(
                c,
                "INSERT INTO sessions (session_id, model_path, weights_digest, reference_backend,"
                " reference_backend_info, alternative_backend, alternative_backend_info, config, tolerances,"
                " seed, inputs_ref, environment, status, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                params,
            ),
            f"create session {sid}",
        )
        return sid

    def update(self, session_id: str, **fields: object) -> None:
        """Update provenance fields / ``results`` of a session (not its status: see update_status)."""
        unknown = set(fields) - set(SESSION_MUTABLE)
        if unknown:
            raise ValueError(f"not updatable session fields: {sorted(unknown)}; status goes through update_session_status")
        if not fields:
            return
        cols = sorted(fields)
        values = [to_json(fields[c]) if c in SESSION_JSON else fields[c] for c in cols]
        # column names come from the fixed whitelist above; values are parameters
        sql = "UPDATE sessions SET " + ", ".join(f"{c} = ?" for c in cols) + ", updated_at = ? WHERE session_id = ?"

        def do(c: Connection) -> None:
            if self.core.execute(c, sql, (*values, utc_now(), session_id)).rowcount != 1:
                raise self._missing(session_id)

        self.core.run_in_transaction(do, f"update session {session_id}")

    def update_status(self, session_id: str, status: str, error_message: str | None = None) -> str:
        """Move a session to ``status`` (checked against :data:`STATUS_TRANSITIONS`, atomically).

        Returns the previous status. Sets ``started_at`` on ``running`` and ``finished_at`` on a
        terminal status. Raises ValidationError (DF005) for a transition that is not allowed.
        """
        if status not in SESSION_STATUSES:
            raise ConfigurationError(f"unknown session status {status!r}", session=session_id,
                                     hint=f"use one of {', '.join(SESSION_STATUSES)}")

        def do(c: Connection) -> str:
            row = self.core.execute(c, "SELECT status FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise self._missing(session_id)
            old = row[0]
            if status not in STATUS_TRANSITIONS[old]:
                raise ValidationError(
                    f"session status cannot go from {old!r} to {status!r}",
                    session=session_id,
                    hint="allowed: created->running|error, running->passed|failed|error; finished sessions are final",
                )
            now = utc_now()
            self.core.execute(
                c,
                "UPDATE sessions SET status = ?, updated_at = ?,"
                " started_at = CASE WHEN ? = 'running' THEN ? ELSE started_at END,"
                " finished_at = CASE WHEN ? IN ('passed','failed','error') THEN ? ELSE finished_at END,"
                " error_message = COALESCE(?, error_message)"
                " WHERE session_id = ?",
                (status, now, status, now, status, now, error_message, session_id),
            )
            if status == "running":  # this process owns it now (owner and heartbeat lease, see leases.py)
                stamp(self.core, c, "sessions", (session_id,))
            return str(old)

        return self.core.run_in_transaction(do, f"set session {session_id} to {status}")

    def get(self, session_id: str) -> JsonObject | None:
        """The session row as a dict (JSON columns decoded), or None."""
        row = self.core.fetch_one("SELECT * FROM sessions WHERE session_id = ?", (session_id,),
                                  f"read session {session_id}")
        return None if row is None else session_from_row(row)

    def list(self, **where: Unpack[SessionFilter]) -> list[JsonObject]:
        """Sessions, newest first, optionally filtered (``model_path``, ``status``,
        ``reference_backend``, ``alternative_backend``) and cut to ``limit``."""
        check_keywords(where, SessionFilter, "list_sessions")
        conditions: list[str] = []
        params: list[object] = []
        for col in _FILTERS:  # column names from _FILTERS, values as parameters
            value = where.get(col)
            if value is None:
                continue
            if col == "model_path":  # as typed, or resolved from here (the engine stores it resolved)
                conditions.append("model_path IN (?, ?)")
                params += [value, model_path_key(str(value))]
            else:
                conditions.append(f"{col} = ?")
                params.append(value)
        limit = where.get("limit")
        sql = "SELECT * FROM sessions"
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        sql += " ORDER BY created_at DESC, session_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [session_from_row(r) for r in self.core.fetch_all(sql, params, "list sessions")]

    def delete(self, session_id: str) -> bool:
        """Delete a session and (by cascade) its results, recordings and comparisons."""
        n = self.core.run_in_transaction(
            lambda c: self.core.execute(c, "DELETE FROM sessions WHERE session_id = ?", (session_id,)).rowcount,
            f"delete session {session_id}",
        )
        return n == 1
