"""A session's rows, moved between databases: read out of one (a Ray worker's private SQLite file)
and written into another (the driver's database, SQLite or PostgreSQL) unchanged.

Only the driver of a distributed batch job owns its database; a worker validates into a temporary
database of its own and returns :func:`export_session` (plain, picklable values), which the driver
writes with :func:`import_session` in one transaction. Column names are the destination's own
(read from its table); a column the destination does not have is dropped, so nothing from the
worker ever becomes SQL text. ``checkpoint_results.id`` is the destination's to assign.
"""

from __future__ import annotations


from ..jsonio import JsonObject
from .core import SqlCore
from .dialect import Connection

__all__ = ["SESSION_TABLES", "export_session", "import_session"]

#: The tables holding one session's rows, parents first (constants, never user input).
SESSION_TABLES = ("sessions", "checkpoint_results", "tensor_recordings", "tensor_comparisons")
_SKIP = {"checkpoint_results": {"id"}}


def export_session(core: SqlCore, session_id: str) -> dict[str, list[JsonObject]]:
    """Every row of session ``session_id``, table by table (raw column values)."""
    def rd(c: Connection) -> dict[str, list[JsonObject]]:
        out: dict[str, list[JsonObject]] = {}
        for table in SESSION_TABLES:
            order = " ORDER BY id" if table == "checkpoint_results" else ""
            rows = core.execute(c, f"SELECT * FROM {table} WHERE session_id = ?{order}", (session_id,)).fetchall()
            out[table] = [{k: v for k, v in dict(r).items() if k not in _SKIP.get(table, ())} for r in rows]
        return out

    return core.read(rd, f"export session {session_id}")


def _columns(core: SqlCore, c: Connection, table: str) -> list[str]:
    cur = core.execute(c, f"SELECT * FROM {table} WHERE 1 = 0")
    return [d[0] for d in cur.description]


def import_session(core: SqlCore, session_id: str, rows: dict[str, list[JsonObject]]) -> int:
    """Write the rows of :func:`export_session` (all of session ``session_id``, replacing any it
    had) in one transaction; returns how many rows were written. A row of another session is
    refused (ValueError): a worker's answer never touches another session."""
    for table in SESSION_TABLES:
        if any(r.get("session_id") != session_id for r in rows.get(table, ())):
            raise ValueError(f"rows of another session than {session_id} in {table}")

    def do(c: Connection) -> int:
        core.execute(c, "DELETE FROM sessions WHERE session_id = ?", (session_id,))
        for table in reversed(SESSION_TABLES[1:]):  # also where foreign keys are not enforced
            core.execute(c, f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
        n = 0
        for table in SESSION_TABLES:
            known = set(_columns(core, c, table)) - _SKIP.get(table, set())
            for row in rows.get(table, ()):
                cols = [k for k in row if k in known]
                marks = ", ".join("?" for _ in cols)
                core.execute(c, f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                             tuple(row[k] for k in cols))
                n += 1
        return n

    return core.run_in_transaction(do, f"import session {session_id}")
