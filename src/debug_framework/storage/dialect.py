"""The narrow seam between the stores and one SQL engine (SQLite here; PostgreSQL in :mod:`.postgres`).

Every statement in :mod:`debug_framework.storage` is written once, in the SQL both engines share
(``?`` placeholders, ``INSERT ... ON CONFLICT (...) DO UPDATE SET c = excluded.c``, ``COALESCE``,
``CASE``), and passes through :meth:`Dialect.sql` before it runs. What differs between engines lives
here and nowhere else: connecting (pragmas), the statement that starts a write transaction, the
auto-increment and JSON column types used by the DDL, introspection, and which driver errors mean
"busy, retry" or "disk full". :class:`~.postgres.PostgresDialect` implements the same protocol
(``%s`` placeholders, ``BIGSERIAL``, an advisory write lock, psycopg's error classes); the stores do
not change.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Protocol

from ..errors import DatabaseError

__all__ = ["Connection", "Dialect", "SQLiteDialect", "SQLITE"]

#: The DB-API connection the stores receive inside a transaction (``sqlite3`` rows are mappings).
Connection = sqlite3.Connection



def _read_only_uri(path: Path) -> str:
    """The URI of a read-only open that creates no file. SQLite opening a WAL database read-only
    creates ``-wal`` and ``-shm`` beside it (and cannot remove them); when neither exists, no
    writer has the file open, so it is opened ``immutable`` (no locks, no shared memory). While a
    writer has it open (they exist) the usual ``mode=ro`` open shares them. ``as_uri`` quotes
    ``?``, ``#`` and ``%`` in the path."""
    uri = f"{path.as_uri()}?mode=ro"
    if not any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm", "-journal")):
        uri += "&immutable=1"
    return uri

class Dialect(Protocol):
    """What the SQL core and the schema ask of a database engine."""

    name: str
    #: the column type of an auto-increment integer primary key
    autoincrement_pk: str
    #: the column type of a JSON document (stored as text by :func:`~.values.to_json`)
    json_type: str
    #: the statement that starts a write transaction holding the write lock
    begin_write: str
    #: driver exceptions the core handles (busy retry, wrapping into DatabaseError)
    error_types: tuple[type[BaseException], ...]

    def connect(self, path: Path, busy_timeout_s: float, read_only: bool = False) -> Connection:
        """A new connection configured for concurrent use (foreign keys, timeouts); ``read_only``
        opens one that can never write (the file, its header and journal mode stay as they are)."""

    def prepare(self, conn: Connection, path: Path) -> None:
        """Settings that may meet a lock (the core retries it while busy), e.g. the journal mode."""

    def set_foreign_keys(self, conn: Connection, enabled: bool) -> None:
        """Turn foreign key enforcement on/off (outside a transaction; migrations rebuild tables)."""

    def broken_references(self, conn: Connection) -> int:
        """How many rows point at a missing parent row (checked before a migration commits)."""

    def sql(self, statement: str) -> str:
        """``statement`` (written with ``?`` placeholders) in this engine's parameter style."""

    def table_exists(self, conn: Connection, name: str) -> bool:
        """Whether the table exists."""

    def columns(self, conn: Connection, table: str) -> list[str]:
        """The column names of a table (``table`` is a constant of the schema, never user input)."""

    def copy_to(self, conn: Connection, target: Path) -> None:
        """Write a consistent copy of the database ``conn`` reads to the new file ``target``."""

    def restart_ids(self, conn: Connection, table: str) -> None:
        """After rows were copied into ``table`` with their ids (a migration's rebuild), make the
        next generated ``id`` follow the largest (``table`` is a schema constant)."""

    def is_busy(self, exc: BaseException) -> bool:
        """The engine reported a lock held by someone else (worth retrying)."""

    def is_disk_full(self, exc: BaseException) -> bool:
        """The engine could not write for lack of disk space."""

    def is_integrity_error(self, exc: BaseException) -> bool:
        """A constraint (foreign key, CHECK, UNIQUE) was violated."""

    def optimize(self, conn: Connection) -> str:
        """The engine's cheap statistics refresh (SQLite ``PRAGMA optimize``; PostgreSQL ``ANALYZE``);
        returns the statement run."""

    def compact(self, conn: Connection) -> str:
        """Give the free pages back to the file system (SQLite ``VACUUM``; PostgreSQL ``VACUUM``),
        outside any transaction; returns the statement run."""

    def reclaimable_bytes(self, conn: Connection) -> int:
        """Bytes :meth:`compact` would give back now (an estimate; 0 when unknown)."""


_BUSY_MARKERS = ("database is locked", "database is busy", "database table is locked", "locked")


class SQLiteDialect:
    """SQLite through the standard library: WAL journal, ``BEGIN IMMEDIATE`` writes, qmark parameters."""

    name = "sqlite"
    autoincrement_pk = "INTEGER PRIMARY KEY AUTOINCREMENT"
    json_type = "TEXT"
    begin_write = "BEGIN IMMEDIATE"
    error_types: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def connect(self, path: Path, busy_timeout_s: float, read_only: bool = False) -> Connection:
        conn = sqlite3.connect(
            _read_only_uri(path) if read_only else str(path),
            timeout=busy_timeout_s,
            isolation_level=None,  # autocommit; writes use explicit BEGIN IMMEDIATE
            check_same_thread=False,  # only its own thread uses it; close() may run elsewhere
            uri=read_only,
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")  # an int: PRAGMA takes no parameters
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def prepare(self, conn: Connection, path: Path) -> None:
        """Switch the file to WAL (readers never block the writer); DatabaseError when it cannot be."""
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise DatabaseError(
                f"could not switch the database to WAL mode (got {mode!r})",
                hint="put the database on a local file system that supports shared memory (not NFS)",
                database=str(path),
            )
        conn.execute("PRAGMA synchronous = NORMAL")

    def set_foreign_keys(self, conn: Connection, enabled: bool) -> None:
        conn.execute(f"PRAGMA foreign_keys = {'ON' if enabled else 'OFF'}")  # a no-op inside a transaction

    def broken_references(self, conn: Connection) -> int:
        return len(conn.execute("PRAGMA foreign_key_check").fetchall())

    def sql(self, statement: str) -> str:
        return statement  # sqlite3's paramstyle is qmark, the style the stores are written in

    def table_exists(self, conn: Connection, name: str) -> bool:
        row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        return row is not None

    def columns(self, conn: Connection, table: str) -> list[str]:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table):
            raise ValueError(f"not a table name: {table!r}")
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]

    def copy_to(self, conn: Connection, target: Path) -> None:
        dest = sqlite3.connect(str(target))
        try:
            conn.backup(dest)
        finally:
            dest.close()

    def restart_ids(self, conn: Connection, table: str) -> None:
        """Nothing to do: an AUTOINCREMENT table's counter follows the largest id inserted."""

    def is_busy(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return True
        text = str(exc).lower()
        return any(m in text for m in _BUSY_MARKERS)

    def is_disk_full(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
            return True
        return "disk is full" in str(exc).lower()

    def is_integrity_error(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)

    def optimize(self, conn: Connection) -> str:
        conn.execute("PRAGMA optimize")
        return "PRAGMA optimize"

    def compact(self, conn: Connection) -> str:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the rewritten pages leave the WAL file too
        return "VACUUM"

    def reclaimable_bytes(self, conn: Connection) -> int:
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        return int(free) * int(page)


#: The dialect every :class:`~debug_framework.storage.core.SqlCore` uses unless given another.
SQLITE = SQLiteDialect()
