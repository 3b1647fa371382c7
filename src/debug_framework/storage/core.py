"""The SQL core: one database file, one connection per (process, thread), transactions with retry.

* The path is always passed in (the default ``~/.pie/debug/debug_framework.db`` is resolved by
  :mod:`debug_framework.config`, never here); ``:memory:`` and ``file:`` URIs are refused (sessions
  are shared between threads and processes through the file). A ``postgresql://`` URL selects the
  :class:`~.postgres.PostgresDialect` (rows on the server, files under its ``artifact_root``).
* Connections open lazily, one per (process, thread), configured by the :class:`~.dialect.Dialect`
  (SQLite: WAL journal, ``foreign_keys=ON``, ``busy_timeout``, autocommit with an explicit
  ``BEGIN IMMEDIATE`` for every write, so a writer takes the write lock up front).
* Every state change is one transaction. A transaction that meets "busy"/"locked" beyond the busy
  timeout is rolled back and re-run with exponential backoff and jitter until ``max_retry_s``; only
  then does a :class:`~debug_framework.errors.DatabaseError` (DF003) surface. A full disk is a
  :class:`~debug_framework.errors.ResourceExhaustedError` (DF007).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict, TypeVar, Unpack

from ..jsonio import JsonObject
from ..config import check_keywords, from_environment
from ..errors import DatabaseError, ResourceExhaustedError, no_space_error
from .dialect import SQLITE, Connection, Dialect
from .postgres import is_server_url

__all__ = ["SqlCore", "CoreSettings", "Params", "Row"]

T = TypeVar("T")
#: Statement parameters: positional (``?``) or named.
Params = Sequence[object] | Mapping[str, object]
#: A row as the stores read it (``sqlite3.Row``: by index and by column name).
Row = Any

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


class CoreSettings(TypedDict, total=False):
    """How a :class:`SqlCore` waits for locks and which engine it speaks."""

    #: how long the engine itself waits for a lock before reporting busy (default 10 s)
    busy_timeout_s: float
    #: how long a busy transaction is retried, with backoff, before DatabaseError (default 120 s)
    max_retry_s: float
    #: the SQL engine (default SQLite)
    dialect: Dialect
    #: open connections that cannot write (nothing on disk changes; a write is DatabaseError)
    read_only: bool
    #: the shared folder of tensor files, inputs and exports of a ``postgresql://`` database
    #: (default ``config["artifact_root"]`` / ``PIE_DEBUG_ARTIFACT_ROOT``; a server has no
    #: "beside the database file")
    artifact_root: str | os.PathLike[str]
    #: how long connecting to a database server may take before DF003 (default 10 s)
    connect_timeout_s: float


def _checked_path(database_path: str | os.PathLike[str], create_dir: bool = True) -> Path:
    """The resolved database file (parent directories created unless not ``create_dir``), or DatabaseError."""
    raw = str(database_path)
    if not raw or raw == ":memory:" or raw.startswith("file:"):
        raise DatabaseError(
            f"database path {raw!r} is not a file path",
            hint="pass a file path; sessions are shared between threads and processes through the file",
            database=raw,
        )
    path = Path(raw).expanduser().resolve()
    if path == _PACKAGE_DIR or _PACKAGE_DIR in path.parents:
        raise DatabaseError(
            "refusing to put the database inside the installed package",
            hint="set config['database_path'] (default ~/.pie/debug/debug_framework.db) elsewhere",
            database=str(path),
        )
    if create_dir:
        _make_parent(path, str(path))
    return path


def _make_parent(path: Path, location: str) -> None:
    """Create ``path``'s directory: a full disk is DF007, anything else DatabaseError (DF003)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        full = no_space_error(exc, "create the database directory", database=location)
        if full is not None:
            raise full from exc
        raise DatabaseError(f"cannot create the database directory {path.parent}: {exc}", database=location,
                            hint="choose a writable location (artifact_root / PIE_DEBUG_ARTIFACT_ROOT for a "
                                 "server, or the database path)") from exc


def server_dialect(database_path: object, settings: CoreSettings) -> Dialect | None:
    """The PostgreSQL dialect for a ``postgresql://`` URL (DatabaseError without an artifact root)."""
    if not is_server_url(database_path):
        return None
    given = settings.get("dialect")
    if given is not None and getattr(given, "url", None) == str(database_path):
        return given  # reopened in another process or thread: the dialect carries its root
    from .postgres import PostgresDialect, redact_url, split_url

    split_url(str(database_path))  # a URL that cannot be read is DF003 before anything else
    root = settings.get("artifact_root") or from_environment().get("artifact_root")
    if not root:
        raise DatabaseError("a PostgreSQL database needs a shared folder for its tensor files, inputs and exports",
                            database=redact_url(str(database_path)),
                            hint="set config['artifact_root'] (or PIE_DEBUG_ARTIFACT_ROOT) to a folder every "
                                 "machine using this database mounts")
    return PostgresDialect(str(database_path), root, float(settings.get("connect_timeout_s", 10.0)))


class SqlCore:
    """Connections, transactions, retries and error wrapping for one database file.

    Args:
        database_path: the database file (``~`` expanded; parent directories created).
        settings: :class:`CoreSettings` (``busy_timeout_s``, ``max_retry_s``, ``dialect``).

    Thread-safe: each thread (and each process, after fork) gets its own connection.
    """

    def __init__(self, database_path: str | os.PathLike[str], **settings: Unpack[CoreSettings]) -> None:
        check_keywords(settings, CoreSettings, type(self).__name__)
        self.read_only = bool(settings.get("read_only", False))
        self.busy_timeout_s = float(settings.get("busy_timeout_s", 10.0))
        self.max_retry_s = float(settings.get("max_retry_s", 120.0))
        self.dialect: Dialect = server_dialect(database_path, settings) or settings.get("dialect", SQLITE)
        #: for a database server, the path its files are named from (``<artifact root>/<dbname>``)
        self.database_path = getattr(self.dialect, "files_anchor", None) or _checked_path(
            database_path, create_dir=not self.read_only)
        #: how messages name the database: the file, or the server URL without its password
        self.location: str = getattr(self.dialect, "location", None) or str(self.database_path)
        if hasattr(self.dialect, "files_anchor") and not self.read_only:
            _make_parent(self.database_path, self.location)
        self._local = threading.local()
        self._all: list[tuple[int, Connection]] = []
        self._all_lock = threading.Lock()
        self._closed = False

    # ---------------------------------------------------------------- connections

    @property
    def target(self) -> str | Path:
        """What opens this database again: the file, or the server URL (it holds the password:
        never print it; :attr:`location` is for messages)."""
        return getattr(self.dialect, "url", None) or self.database_path

    def _open(self) -> Connection:
        if self.read_only and hasattr(self.dialect, "url"):
            return self.dialect.connect(self.database_path, self.busy_timeout_s, read_only=True)
        if self.read_only:  # no journal-mode switch: a reader leaves the file exactly as it found it
            if not self.database_path.is_file():
                raise DatabaseError("no database at this path", database=self.location,
                                    hint="a database opened read-only is never created")
            return self.dialect.connect(self.database_path, self.busy_timeout_s, read_only=True)
        conn = self.dialect.connect(self.database_path, self.busy_timeout_s)
        self.retry(lambda: self.dialect.prepare(conn, self.database_path), "prepare the connection")
        return conn

    def _refuse_write(self, what: str) -> None:
        if self.read_only:
            raise DatabaseError(f"cannot {what}: the database was opened read-only", database=self.location,
                                hint="open it without read_only to change it")

    def get_connection(self) -> Connection:
        """This thread's connection (opened on first use; reopened after ``fork``)."""
        if self._closed:
            raise DatabaseError("the database was closed", database=self.location,
                                hint="open it again (a new Database)")
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid() or getattr(conn, "broken", False):
            try:
                conn = self._open()
            except self.dialect.error_types as exc:
                raise self.wrap(exc, "open the database") from exc
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._all_lock:
                self._all.append((os.getpid(), conn))
        return conn

    def close(self) -> None:
        """Close every connection opened in this process (after a fork, connections inherited from
        the parent are left alone: closing them in the child is unsafe in SQLite)."""
        pid = os.getpid()
        with self._all_lock:
            mine = [c for p, c in self._all if p == pid]
            self._all = []
        for c in mine:
            try:
                c.close()
            except self.dialect.error_types:
                pass
        self._local = threading.local()

    # ---------------------------------------------------------------- errors and retries

    def wrap(self, exc: BaseException, what: str) -> DatabaseError | ResourceExhaustedError:
        """The framework error (DF003, or DF007 for a full disk) for a driver error while doing ``what``."""
        if isinstance(exc, DatabaseError):
            return exc
        where = self.location
        if self.dialect.is_disk_full(exc):
            return ResourceExhaustedError(
                f"disk full while trying to {what}: {exc}",
                hint="free disk space or move the database (config['database_path']); completed rows are kept",
                database=where,
            )
        if self.dialect.is_busy(exc):
            return DatabaseError(
                f"could not {what}: the database stayed locked for {self.max_retry_s:.0f} s ({exc})",
                hint="another process holds a long write transaction; retry later or raise max_retry_s",
                database=where,
            )
        if self.dialect.is_integrity_error(exc):
            return DatabaseError(f"could not {what}: constraint violated ({exc})", database=where,
                                 hint="check the session/recording ids exist and values are allowed")
        # the dialect's own hint (a server's differs from SQLite's "check the path is writable")
        return DatabaseError(f"could not {what}: {exc}", database=where, hint=getattr(self.dialect, "error_hint", None))

    def retry(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn``, re-running it with backoff and jitter while the database is busy (raw errors out)."""
        deadline = time.monotonic() + self.max_retry_s
        delay = 0.002
        while True:
            try:
                return fn()
            except self.dialect.error_types as exc:
                if not self.dialect.is_busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 0.2)

    def run_in_transaction(self, fn: Callable[[Connection], T], what: str = "write to the database") -> T:
        """Run ``fn(conn)`` inside one write transaction; commit, or roll back and raise.

        Busy/locked failures roll back and re-run ``fn`` (it must only touch the database). Called
        while this thread is already in a transaction, ``fn`` joins it.
        """
        self._refuse_write(what)
        conn = self.get_connection()
        if conn.in_transaction:
            return fn(conn)

        def attempt() -> T:
            conn.execute(self.dialect.begin_write)
            try:
                out = fn(conn)
                conn.execute("COMMIT")
                return out
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        try:
            return self.retry(attempt, what)
        except self.dialect.error_types as exc:
            raise self.wrap(exc, what) from exc

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """``with db.transaction() as conn:`` one atomic state change (BEGIN IMMEDIATE ... COMMIT).

        Taking the write lock at BEGIN means later statements do not meet a busy database; the
        BEGIN itself is retried with backoff. Nested use joins the outer transaction.
        """
        self._refuse_write("begin a write transaction")
        conn = self.get_connection()
        if conn.in_transaction:
            yield conn
            return
        try:
            self.retry(lambda: conn.execute(self.dialect.begin_write), "begin a transaction")
        except self.dialect.error_types as exc:
            raise self.wrap(exc, "begin a transaction") from exc
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            if getattr(self.dialect, "commit_retryable", True):  # SQLite: a busy COMMIT keeps the transaction
                self.retry(lambda: conn.execute("COMMIT"), "commit")
            else:  # a failed COMMIT has ended the transaction: retrying it would "succeed" having written nothing
                conn.execute("COMMIT")
        except self.dialect.error_types as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self.wrap(exc, "commit a transaction") from exc

    def read(self, fn: Callable[[Connection], T], what: str) -> T:
        """Run a read ``fn(conn)`` (retried while busy; driver errors wrapped)."""
        conn = self.get_connection()
        try:
            return self.retry(lambda: fn(conn), what)
        except self.dialect.error_types as exc:
            raise self.wrap(exc, what) from exc

    # ---------------------------------------------------------------- statements

    def execute(self, conn: Connection, statement: str, params: Params = ()) -> Any:
        """Run one parameterised statement (written with ``?``) on ``conn``; returns the cursor."""
        return conn.execute(self.dialect.sql(statement), params)

    def executemany(self, conn: Connection, statement: str, rows: Iterable[Sequence[object]]) -> Any:
        """Run one parameterised statement once per row of parameters."""
        return conn.executemany(self.dialect.sql(statement), rows)

    def fetch_one(self, statement: str, params: Params, what: str) -> Row | None:
        """The first row of a read, or None."""
        return self.read(lambda c: self.execute(c, statement, params).fetchone(), what)

    def fetch_all(self, statement: str, params: Params, what: str) -> list[Row]:
        """Every row of a read."""
        return self.read(lambda c: self.execute(c, statement, params).fetchall(), what)

    def execute_query(self, query: str, parameters: Params = ()) -> list[JsonObject] | int:
        """Run one parameterised statement.

        Returns a list of dicts for statements that return rows (SELECT, ... RETURNING), else the
        number of rows changed. Writes run in their own transaction (or join the current one).
        """
        head = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
        if head in ("SELECT", "PRAGMA", "EXPLAIN", "WITH") and "RETURNING" not in query.upper():
            return self.read(lambda c: [dict(r) for r in self.execute(c, query, parameters).fetchall()],
                             "run a query")

        def write(c: Connection) -> list[JsonObject] | int:
            cur = self.execute(c, query, parameters)
            if cur.description is not None:
                return [dict(r) for r in cur.fetchall()]
            return int(cur.rowcount)

        return self.run_in_transaction(write, "run a statement")
