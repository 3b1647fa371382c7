"""The PostgreSQL dialect: sessions on a database server a team shares (``postgresql://...``).

Speaks the same :class:`~.dialect.Dialect` protocol as SQLite, through psycopg 3 (the ``postgres``
extra), so the stores do not change:

* statements written with ``?`` become ``%s`` (a literal ``%`` is doubled, text inside quotes is
  left alone) and SQLite's null-safe ``x IS ?`` becomes ``x IS NOT DISTINCT FROM %s``;
* the DDL's ``INTEGER`` and ``REAL`` become ``BIGINT`` and ``DOUBLE PRECISION`` (SQLite's are 8
  bytes; PostgreSQL's ``REAL`` would round a heartbeat timestamp to minutes); JSON documents stay
  ``TEXT`` (they keep NaN and infinities, which ``JSONB`` refuses);
* a write transaction is ``BEGIN`` plus a transaction-scoped advisory lock, so writers are serialised
  exactly as SQLite's ``BEGIN IMMEDIATE`` serialises them (every read-check-write in the stores stays
  atomic) while readers never wait; a lock not granted within the busy timeout (``lock_timeout``),
  a deadlock or a serialisation failure is "busy" and the core retries it;
* connecting is bounded (``connect_timeout``, default 10 s); a server that cannot be reached or
  refuses the credentials is DatabaseError (DF003) naming the host and database, never the password
  (:func:`redact_url`); a read-only open sets ``default_transaction_read_only``.

Tensor files, saved inputs and exports are not rows: they live under the configured artifact root
(``config["artifact_root"]`` / ``PIE_DEBUG_ARTIFACT_ROOT``, a folder every machine of the team
mounts), in ``<root>/<database name>_tensors`` etc. (:attr:`PostgresDialect.files_anchor`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from ..config import is_server_url
from ..errors import DatabaseError

__all__ = ["PostgresDialect", "is_server_url", "redact_url", "PgConnection"]

_DDL_TYPES = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION"}
#: the advisory lock key every write transaction takes (one writer at a time, as in SQLite)
WRITE_LOCK_KEY = 0x5049_4544  # "PIED"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def split_url(url: str) -> SplitResult:
    """``urlsplit(url)``; a URL it cannot read (an unclosed IPv6 bracket ``[::1``, a bracketed host
    that is not an address) is DatabaseError (DF003), never a ``ValueError`` read as a bug."""
    try:
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 - the host is parsed lazily: make it fail here
    except ValueError as exc:
        scheme = url.split("://", 1)[0] if "://" in url else "postgresql"
        raise DatabaseError(f"the server URL cannot be read: {exc}", database=f"{scheme}://...",
                            hint="postgresql://user:password@host:5432/dbname; an IPv6 host in brackets: "
                                 "postgresql://user@[::1]:5432/dbname") from None
    return parts


def _port_of(url: str) -> int | None:
    """The URL's port (None when absent); DatabaseError (DF003) when it cannot be read (a typo such
    as ``host:54x2``, or libpq's multi-host form, which this dialect does not take)."""
    parts = split_url(url)
    try:
        return parts.port
    except ValueError:
        raise DatabaseError("the server URL's host:port cannot be read",
                            database=f"{parts.scheme}://{parts.hostname or 'localhost'}/...",
                            hint="postgresql://user:password@host:5432/dbname (one host, a numeric port)") from None


def redact_url(url: str) -> str:
    """``url`` without its password (and without query parameters, which may carry one); a port
    that cannot be read is left out rather than raising, and so is a URL that cannot be read at all."""
    try:
        parts = split_url(url)
    except DatabaseError:
        return (url.split("://", 1)[0] if "://" in url else "postgresql") + "://..."
    host = parts.hostname or "localhost"
    netloc = f"{parts.username}@" if parts.username else ""
    netloc += f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    if port:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _host_of(url: str) -> str:
    return f"{split_url(url).hostname or 'localhost'}:{_port_of(url) or 5432}"


def _translate(statement: str) -> str:
    """``?`` -> ``%s`` outside quoted text, ``%`` -> ``%%`` everywhere; ``IS [NOT] ?`` null-safe."""
    out: list[str] = []
    for i, chunk in enumerate(re.split(r"('(?:[^']|'')*')", statement)):
        if i % 2:  # a quoted literal: as written, its '%' doubled (psycopg parses every '%' of a statement)
            out.append(chunk.replace("%", "%%"))
            continue
        chunk = chunk.replace("%", "%%")
        chunk = re.sub(r"\bIS\s+NOT\s+\?", "IS DISTINCT FROM ?", chunk, flags=re.IGNORECASE)
        chunk = re.sub(r"\bIS\s+\?", "IS NOT DISTINCT FROM ?", chunk, flags=re.IGNORECASE)
        out.append(chunk.replace("?", "%s"))
    sql = "".join(out)
    if re.match(r"\s*(CREATE\s+TABLE|ALTER\s+TABLE)", sql, flags=re.IGNORECASE):
        sql = re.sub(r"\b(INTEGER|REAL)\b", lambda m: _DDL_TYPES[m.group(1)], sql)
    return sql


class PgRow(tuple):  # type: ignore[type-arg]
    """A row readable by index and by column name, with ``keys()`` (what ``sqlite3.Row`` offers)."""

    _names: tuple[str, ...] = ()

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names.index(key))
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Any:
    names = tuple(c.name for c in cursor.description or ())

    def make(values: Any) -> PgRow:
        row = PgRow(values)
        row._names = names
        return row

    return make


class PgConnection:
    """A psycopg connection shaped like the ``sqlite3`` one the core and the stores use
    (``execute`` returning a cursor, ``executemany``, ``in_transaction``, ``close``)."""

    def __init__(self, conn: Any) -> None:
        self.raw = conn

    def execute(self, statement: str, params: Any = None) -> Any:
        try:
            return self.raw.execute(statement, params)
        except BaseException:
            # a BEGIN whose lock was not granted leaves an aborted transaction behind; SQLite's
            # failed BEGIN IMMEDIATE leaves none, and the core retries the BEGIN expecting that
            if statement.startswith("BEGIN") and not self.raw.closed and self.in_transaction:
                self.raw.execute("ROLLBACK")
            raise

    def executemany(self, statement: str, rows: Any) -> Any:
        cur = self.raw.cursor()
        cur.executemany(statement, list(rows))
        return cur

    @property
    def broken(self) -> bool:
        """The server went away (restart, network): the core opens a new connection next time."""
        return bool(self.raw.broken or self.raw.closed)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.raw.info.transaction_status != TransactionStatus.IDLE)

    def close(self) -> None:
        self.raw.close()


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise DatabaseError("a postgresql:// database needs the psycopg driver",
                            hint="pip install 'multi-backend-debug-framework[postgres]'") from exc
    return psycopg


def _bool_as_int(psycopg: Any) -> type:
    """Python bools stored as 0/1 (the schema's flag columns are integers, as in SQLite)."""
    from psycopg.adapt import Dumper

    class BoolAsInt(Dumper):
        oid = psycopg.adapters.types["int8"].oid

        def dump(self, obj: bool) -> bytes:
            return b"1" if obj else b"0"

    return BoolAsInt


class PostgresDialect:
    """PostgreSQL through psycopg 3 (see the module docstring).

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (libpq's URL form).
        artifact_root: the shared folder for tensor files, inputs and exports.
        connect_timeout_s: how long connecting may take before DF003 (default 10 s).
    """

    name = "postgresql"
    autoincrement_pk = "BIGSERIAL PRIMARY KEY"
    json_type = "TEXT"
    begin_write = f"BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})"
    #: PostgreSQL databases are new with this dialect: an empty one is created at this schema
    #: version directly (SQLite's table-rebuilding steps 1 and 2 exist only for old files)
    baseline_version = 2
    #: a COMMIT that fails has already ended the transaction on PostgreSQL: never retried
    commit_retryable = False
    #: the server's clock, which every host sharing the database reads for its leases
    clock_sql = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"

    #: the hint of a DF003 this dialect's driver raised (SQLite's default speaks of a writable path)
    error_hint = ("check that the PostgreSQL server is running and reachable (a dropped server or connection "
                  "ends the command; run it again once the server is back: committed rows are kept)")

    def __init__(self, url: str, artifact_root: str | Path, connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self.location = redact_url(url)
        self.host = _host_of(url)
        self.connect_timeout_s = float(connect_timeout_s)
        dbname = unquote(urlsplit(url).path.lstrip("/")) or (urlsplit(url).username or "postgres")
        if not _PLAIN_NAME.fullmatch(dbname):
            raise DatabaseError(f"database name {dbname!r} cannot name a folder", database=self.location,
                                hint="use a database name of letters, digits, '_', '-', '.'")
        root = Path(artifact_root).expanduser().resolve()
        #: where the files of this database are named from: ``<root>/<dbname>_tensors`` etc.
        self.files_anchor = root / dbname
        self.error_types: tuple[type[BaseException], ...] = (_psycopg().Error,)

    def __repr__(self) -> str:
        return f"PostgresDialect({self.location!r})"

    def connect(self, path: Path, busy_timeout_s: float, read_only: bool = False) -> PgConnection:
        psycopg = _psycopg()
        options = f"-c lock_timeout={int(busy_timeout_s * 1000)}"
        if read_only:
            options += " -c default_transaction_read_only=on"
        try:
            raw = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s)),
                                  options=options, row_factory=_row_factory)
        except psycopg.Error as exc:
            raise self.unreachable(exc) from exc
        raw.adapters.register_dumper(bool, _bool_as_int(psycopg))
        return PgConnection(raw)

    def unreachable(self, exc: BaseException) -> DatabaseError:
        """DF003 for a failed connection: the host and database named, the password never."""
        text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        password = urlsplit(self.url).password
        if password:
            text = text.replace(password, "***")
        return DatabaseError(f"cannot connect to the PostgreSQL server at {self.host}: {text}",
                             database=self.location,
                             hint="check the server is running and reachable, and the user name and password "
                                  "in the URL (connect_timeout bounds the wait)")

    def prepare(self, conn: PgConnection, path: Path) -> None:
        """Nothing to switch: the server's MVCC lets readers run beside the writer."""

    def set_foreign_keys(self, conn: PgConnection, enabled: bool) -> None:
        """Always enforced by the server (the baseline schema needs no table rebuilds)."""

    def broken_references(self, conn: PgConnection) -> int:
        return 0  # enforced on every statement: a broken reference cannot be committed

    def sql(self, statement: str) -> str:
        return _translate(statement)

    def table_exists(self, conn: PgConnection, name: str) -> bool:
        row = conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema()"
                           " AND table_name = %s", (name,)).fetchone()
        return row is not None

    def columns(self, conn: PgConnection, table: str) -> list[str]:
        rows = conn.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
                            " AND table_name = %s ORDER BY ordinal_position", (table,)).fetchall()
        return [r[0] for r in rows]

    def copy_to(self, conn: PgConnection, target: Path) -> None:
        raise DatabaseError("a PostgreSQL database of an older schema version cannot be read without migrating it",
                            database=self.location, hint="open it once read-write (any engine start migrates it)")

    def restart_ids(self, conn: PgConnection, table: str) -> None:
        """The ``id`` sequence (BIGSERIAL) set past the largest id copied in."""
        conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false)"
                     f" FROM {table}")

    def is_busy(self, exc: BaseException) -> bool:
        errors = _psycopg().errors
        return isinstance(exc, (errors.LockNotAvailable, errors.DeadlockDetected, errors.SerializationFailure))

    def is_disk_full(self, exc: BaseException) -> bool:
        return isinstance(exc, _psycopg().errors.DiskFull)

    def is_integrity_error(self, exc: BaseException) -> bool:
        return isinstance(exc, _psycopg().IntegrityError)

    def optimize(self, conn: PgConnection) -> str:
        conn.execute("ANALYZE")
        return "ANALYZE"

    def compact(self, conn: PgConnection) -> str:
        conn.execute("VACUUM")  # autocommit: VACUUM cannot run inside a transaction
        return "VACUUM"

    def reclaimable_bytes(self, conn: PgConnection) -> int:
        """Dead rows times the average row size of their table (the statistics' estimate)."""
        row = conn.execute(
            "SELECT COALESCE(SUM(s.n_dead_tup * pg_relation_size(s.relid) / GREATEST(s.n_live_tup + s.n_dead_tup, 1)), 0)"
            " FROM pg_stat_user_tables s").fetchone()
        return int(row[0] or 0)
