"""SQLite storage for validation sessions: versioned schema, WAL, safe across threads and processes.

Design (see ``docs/storage.md``):

* One :class:`DatabaseManager` per database file. The path is always passed in (the default
  ``~/.pie/debug/debug_framework.db`` is resolved by :mod:`debug_framework.config`, never here).
* One ``sqlite3`` connection per (process, thread), opened lazily: WAL journal, ``foreign_keys=ON``,
  ``busy_timeout``, autocommit mode with explicit ``BEGIN IMMEDIATE`` for every write, so a writer
  takes the write lock up front and never fails half way with ``SQLITE_BUSY``.
* Every state change is one transaction. Transactions that meet ``SQLITE_BUSY``/"locked" beyond
  the busy timeout are rolled back and re-run with exponential backoff and jitter until
  ``max_retry_s``; only then does a :class:`~debug_framework.errors.DatabaseError` surface, so
  "database is locked" never reaches a caller under ordinary contention.
* Every SQL statement is parameterised. JSON columns are written with :func:`to_json` (NaN and
  infinities kept as ``NaN``/``Infinity`` tokens, never pickle).
* The schema carries its version in ``schema_version``; :meth:`DatabaseManager.migrate_schema`
  walks any older database up one step at a time (0 -> 1 -> 2), each step one transaction.
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from ..errors import DatabaseError, ResourceExhaustedError, ValidationError

__all__ = [
    "DatabaseManager",
    "SCHEMA_VERSION",
    "SESSION_STATUSES",
    "STATUS_TRANSITIONS",
    "TERMINAL_STATUSES",
    "METRIC_COLUMNS",
    "RECORDING_SIDES",
    "BATCH_JOB_STATUSES",
    "BATCH_ITEM_STATUSES",
    "to_json",
    "from_json",
    "utc_now",
]

T = TypeVar("T")

#: The schema version this code writes. ``migrate_schema`` brings older files up to it.
SCHEMA_VERSION = 2

SESSION_STATUSES = ("created", "running", "passed", "failed", "error")
#: Allowed status changes. Terminal states (passed/failed/error) never change again.
STATUS_TRANSITIONS: dict[str, frozenset[str]] = {
    "created": frozenset({"running", "error"}),
    "running": frozenset({"passed", "failed", "error"}),
    "passed": frozenset(),
    "failed": frozenset(),
    "error": frozenset(),
}
TERMINAL_STATUSES = frozenset({"passed", "failed", "error"})
RECORDING_SIDES = ("reference", "alternative", "oracle")
BATCH_JOB_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
BATCH_ITEM_STATUSES = ("pending", "running", "done", "failed", "cancelled")

#: Metric keys of ``ComparisonResult.to_dict()`` stored as their own columns (name -> SQL type).
METRIC_COLUMNS: dict[str, str] = {
    "reason": "TEXT",
    "shape_match": "INTEGER",
    "dtype_match": "INTEGER",
    "numel": "INTEGER",
    "max_abs_error": "REAL",
    "mean_abs_error": "REAL",
    "median_abs_error": "REAL",
    "p99_abs_error": "REAL",
    "max_rel_error": "REAL",
    "mean_rel_error": "REAL",
    "rmse": "REAL",
    "rel_l2_error": "REAL",
    "cosine_similarity": "REAL",
    "sqnr_db": "REAL",
    "mismatch_count": "INTEGER",
    "mismatch_percent": "REAL",
    "max_ulp_error": "REAL",
    "nan_count_ref": "INTEGER",
    "nan_count_alt": "INTEGER",
    "inf_count_ref": "INTEGER",
    "inf_count_alt": "INTEGER",
}
#: Keys of a result dict stored as JSON columns.
_JSON_RESULT_KEYS = ("first_nonfinite_index", "worst", "tolerance")
#: Keys that identify the row rather than measure anything.
_KEY_FIELDS = ("checkpoint", "layer", "passed", "introduced_error", "propagated_error")

_BUSY_MARKERS = ("database is locked", "database is busy", "database table is locked", "locked")


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def utc_now() -> str:
    """Current UTC time as ISO-8601 with microseconds (sortable as text)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _json_default(obj: Any) -> Any:
    # NumPy / torch scalars and arrays, sets, paths, datetimes: converted, never pickled.
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.hex()
    tolist = getattr(obj, "tolist", None)  # numpy scalar -> python scalar; arrays/tensors -> lists
    if callable(tolist):
        return tolist()
    return str(obj)  # dtypes, devices, enums: their readable name


def to_json(value: Any) -> str | None:
    """JSON text for a column; ``None`` stays SQL NULL. NaN/Infinity are kept (Python's tokens)."""
    if value is None:
        return None
    return json.dumps(value, default=_json_default, sort_keys=True)


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _as_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    return int(value)


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    f = float(value)
    return None if math.isnan(f) else f  # SQLite turns NaN into NULL anyway; the JSON keeps it


def _as_bool(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return True
    text = str(exc).lower()
    return any(m in text for m in _BUSY_MARKERS)


def _is_disk_full(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
        return True
    return "disk is full" in str(exc).lower()


def _layer_key(layer: int | None) -> int:
    return -1 if layer is None else int(layer)


# --------------------------------------------------------------------------------------------
# schema: one function per migration step; each runs inside its own BEGIN IMMEDIATE transaction
# --------------------------------------------------------------------------------------------

_SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER NOT NULL,
    applied_at TEXT    NOT NULL
)"""

# Version 1: the first release layout (kept verbatim so old files can be walked forward).
_V1_TABLES = (
    """CREATE TABLE sessions (
        session_id          TEXT PRIMARY KEY,
        model_path          TEXT NOT NULL,
        reference_backend   TEXT NOT NULL,
        alternative_backend TEXT NOT NULL,
        config              TEXT NOT NULL DEFAULT '{}',
        status              TEXT NOT NULL DEFAULT 'created',
        results             TEXT,
        error_message       TEXT,
        created_at          TEXT NOT NULL,
        updated_at          TEXT NOT NULL
    )""",
    """CREATE TABLE checkpoint_results (
        id             INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id     TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        checkpoint     TEXT NOT NULL,
        layer          INTEGER,
        passed         INTEGER,
        max_abs_error  REAL,
        mean_abs_error REAL,
        metrics_json   TEXT,
        created_at     TEXT NOT NULL
    )""",
    """CREATE TABLE tensor_recordings (
        recording_id TEXT PRIMARY KEY,
        session_id   TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        tensor_name  TEXT NOT NULL,
        path         TEXT NOT NULL,
        metadata     TEXT,
        created_at   TEXT NOT NULL
    )""",
)


def _v2_sessions_sql(name: str) -> str:
    statuses = ", ".join(f"'{s}'" for s in SESSION_STATUSES)  # constants, not user input
    return f"""CREATE TABLE {name} (
        session_id               TEXT PRIMARY KEY,
        model_path               TEXT NOT NULL,
        weights_digest           TEXT,
        reference_backend        TEXT NOT NULL,
        reference_backend_info   TEXT,
        alternative_backend      TEXT NOT NULL,
        alternative_backend_info TEXT,
        config                   TEXT NOT NULL DEFAULT '{{}}',
        tolerances               TEXT,
        seed                     INTEGER,
        inputs_ref               TEXT,
        environment              TEXT,
        status                   TEXT NOT NULL DEFAULT 'created' CHECK (status IN ({statuses})),
        error_message            TEXT,
        results                  TEXT,
        created_at               TEXT NOT NULL,
        updated_at               TEXT NOT NULL,
        started_at               TEXT,
        finished_at              TEXT
    )"""


def _v2_checkpoint_results_sql(name: str) -> str:
    metric_cols = ",\n        ".join(f"{col} {typ}" for col, typ in METRIC_COLUMNS.items())
    return f"""CREATE TABLE {name} (
        id                    INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id            TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        checkpoint            TEXT NOT NULL,
        layer                 INTEGER,
        layer_key             INTEGER NOT NULL,
        passed                INTEGER,
        {metric_cols},
        first_nonfinite_index TEXT,
        worst                 TEXT,
        tolerance             TEXT,
        introduced_error      REAL,
        propagated_error      REAL,
        extra                 TEXT,
        metrics_json          TEXT NOT NULL,
        created_at            TEXT NOT NULL,
        updated_at            TEXT NOT NULL,
        UNIQUE (session_id, checkpoint, layer_key)
    )"""


def _v2_tensor_recordings_sql(name: str) -> str:
    sides = ", ".join(f"'{s}'" for s in RECORDING_SIDES)
    return f"""CREATE TABLE {name} (
        recording_id TEXT PRIMARY KEY,
        session_id   TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        tensor_name  TEXT NOT NULL,
        checkpoint   TEXT,
        layer        INTEGER,
        side         TEXT CHECK (side IS NULL OR side IN ({sides})),
        content_hash TEXT,
        shape        TEXT,
        dtype        TEXT,
        nbytes       INTEGER,
        path         TEXT NOT NULL,
        score        REAL,
        metadata     TEXT,
        created_at   TEXT NOT NULL
    )"""


_V2_NEW_TABLES = (
    """CREATE TABLE tensor_comparisons (
        comparison_id            TEXT PRIMARY KEY,
        session_id               TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        checkpoint               TEXT,
        layer                    INTEGER,
        reference_recording_id   TEXT REFERENCES tensor_recordings(recording_id) ON DELETE SET NULL,
        alternative_recording_id TEXT REFERENCES tensor_recordings(recording_id) ON DELETE SET NULL,
        match_status             INTEGER NOT NULL,
        max_absolute_error       REAL,
        max_relative_error       REAL,
        tolerance_config         TEXT,
        metrics_json             TEXT,
        created_at               TEXT NOT NULL
    )""",
    f"""CREATE TABLE batch_jobs (
        job_id     TEXT PRIMARY KEY,
        config     TEXT NOT NULL DEFAULT '{{}}',
        status     TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status IN ({", ".join(f"'{s}'" for s in BATCH_JOB_STATUSES)})),
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    f"""CREATE TABLE batch_job_items (
        job_id        TEXT NOT NULL REFERENCES batch_jobs(job_id) ON DELETE CASCADE,
        item_index    INTEGER NOT NULL,
        model_path    TEXT NOT NULL,
        status        TEXT NOT NULL DEFAULT 'pending'
                      CHECK (status IN ({", ".join(f"'{s}'" for s in BATCH_ITEM_STATUSES)})),
        session_id    TEXT REFERENCES sessions(session_id) ON DELETE SET NULL,
        error_message TEXT,
        updated_at    TEXT NOT NULL,
        PRIMARY KEY (job_id, item_index)
    )""",
)

_V2_INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_model ON sessions(model_path, reference_backend, alternative_backend)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_status ON sessions(status)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_created ON sessions(created_at)",
    "CREATE INDEX IF NOT EXISTS idx_checkpoint_results_session ON checkpoint_results(session_id, id)",
    "CREATE INDEX IF NOT EXISTS idx_tensor_recordings_session ON tensor_recordings(session_id)",
    "CREATE INDEX IF NOT EXISTS idx_tensor_recordings_hash ON tensor_recordings(content_hash)",
    "CREATE INDEX IF NOT EXISTS idx_tensor_comparisons_session ON tensor_comparisons(session_id)",
    "CREATE INDEX IF NOT EXISTS idx_batch_items_session ON batch_job_items(session_id)",
)


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    # table names here are constants of this module; PRAGMA cannot take parameters
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    """Empty file, or the unversioned prototype (one ``debug_sessions`` table) -> version 1."""
    conn.execute(_SCHEMA_VERSION_TABLE)
    for sql in _V1_TABLES:
        conn.execute(sql)
    if _table_exists(conn, "debug_sessions"):
        cols = set(_columns(conn, "debug_sessions"))
        now = utc_now()
        for row in conn.execute("SELECT * FROM debug_sessions").fetchall():
            r = {k: row[k] for k in row.keys()}
            status = str(r.get("status") or "created")
            message = None
            if status not in SESSION_STATUSES:
                message = f"migrated from the unversioned layout with unknown status {status!r}"
                status = "error"
            created = str(r.get("created_at") or now)
            conn.execute(
                "INSERT INTO sessions (session_id, model_path, reference_backend, alternative_backend, config,"
                " status, results, error_message, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    str(r["session_id"]),
                    str(r.get("model_path") or ""),
                    str(r.get("reference_backend") or ""),
                    str(r.get("alternative_backend") or ""),
                    r.get("config") if "config" in cols and r.get("config") is not None else "{}",
                    status,
                    r.get("results") if "results" in cols else None,
                    message,
                    created,
                    now,
                ),
            )
        conn.execute("DROP TABLE debug_sessions")  # its rows now live in sessions


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Version 1 -> 2: full session provenance, every metric as a column, tensor store columns,
    tensor_comparisons, batch jobs. Tables are rebuilt (SQLite cannot add CHECK/UNIQUE in place)."""
    # sessions
    conn.execute(_v2_sessions_sql("sessions_v2"))
    conn.execute(
        "INSERT INTO sessions_v2 (session_id, model_path, reference_backend, alternative_backend, config,"
        " status, results, error_message, created_at, updated_at, finished_at)"
        " SELECT session_id, model_path, reference_backend, alternative_backend, config,"
        " CASE WHEN status IN ('created','running','passed','failed','error') THEN status ELSE 'error' END,"
        " results,"
        " CASE WHEN status IN ('created','running','passed','failed','error') THEN error_message"
        "      ELSE COALESCE(error_message, 'migrated from version 1 with unknown status ' || quote(status)) END,"
        " created_at, updated_at,"
        " CASE WHEN status IN ('passed','failed','error') THEN updated_at ELSE NULL END"
        " FROM sessions"
    )
    # checkpoint results: metrics moved from the JSON blob into columns; the newest row per key wins
    conn.execute(_v2_checkpoint_results_sql("checkpoint_results_v2"))
    old = conn.execute(
        "SELECT id, session_id, checkpoint, layer, passed, max_abs_error, mean_abs_error, metrics_json, created_at"
        " FROM checkpoint_results ORDER BY id"
    ).fetchall()
    for rid, sid, cp, layer, passed, max_abs, mean_abs, mjson, created in old:
        metrics = from_json(mjson) or {}
        if not isinstance(metrics, dict):
            metrics = {"legacy_metrics": metrics}
        metrics.setdefault("max_abs_error", max_abs)
        metrics.setdefault("mean_abs_error", mean_abs)
        metrics.setdefault("passed", None if passed is None else bool(passed))
        metrics["checkpoint"], metrics["layer"] = cp, layer
        values = _result_row_values(sid, metrics, cp, layer, None, None, created)
        conn.execute(_UPSERT_RESULT_SQL.replace("checkpoint_results", "checkpoint_results_v2", 1), values)
    # tensor recordings: structured columns recovered from the metadata JSON where present
    conn.execute(_v2_tensor_recordings_sql("tensor_recordings_v2"))
    for rec_id, sid, name, path, meta, created in conn.execute(
        "SELECT recording_id, session_id, tensor_name, path, metadata, created_at FROM tensor_recordings"
    ).fetchall():
        m = from_json(meta) or {}
        m = m if isinstance(m, dict) else {"legacy_metadata": m}
        conn.execute(
            "INSERT INTO tensor_recordings_v2 (recording_id, session_id, tensor_name, checkpoint, layer, side,"
            " content_hash, shape, dtype, nbytes, path, score, metadata, created_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                rec_id, sid, name, m.get("checkpoint"), m.get("layer"),
                m.get("side") if m.get("side") in RECORDING_SIDES else None,
                m.get("content_hash"), to_json(m.get("shape")), m.get("dtype"), m.get("nbytes"),
                path, None, to_json(m), created,
            ),
        )
    for table in ("tensor_recordings", "checkpoint_results", "sessions"):
        conn.execute(f"DROP TABLE {table}")
    for table in ("sessions", "checkpoint_results", "tensor_recordings"):
        conn.execute(f"ALTER TABLE {table}_v2 RENAME TO {table}")
    for sql in _V2_NEW_TABLES:
        conn.execute(sql)
    for sql in _V2_INDEXES:
        conn.execute(sql)


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_0_to_1, 2: _migrate_1_to_2}

_RESULT_COLUMNS = (
    ["session_id", "checkpoint", "layer", "layer_key", "passed"]
    + list(METRIC_COLUMNS)
    + list(_JSON_RESULT_KEYS)
    + ["introduced_error", "propagated_error", "extra", "metrics_json", "created_at", "updated_at"]
)
_UPSERT_RESULT_SQL = (
    f"INSERT INTO checkpoint_results ({', '.join(_RESULT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _RESULT_COLUMNS)}) "
    "ON CONFLICT (session_id, checkpoint, layer_key) DO UPDATE SET "
    + ", ".join(
        f"{c} = excluded.{c}" for c in _RESULT_COLUMNS if c not in ("session_id", "checkpoint", "layer_key", "created_at")
    )
)


def _result_row_values(
    session_id: str,
    result: Mapping[str, Any],
    checkpoint: str,
    layer: int | None,
    introduced_error: float | None,
    propagated_error: float | None,
    now: str,
) -> tuple[Any, ...]:
    values: list[Any] = [session_id, checkpoint, layer, _layer_key(layer), _as_bool(result.get("passed"))]
    for col, typ in METRIC_COLUMNS.items():
        v = result.get(col)
        if v is None:
            values.append(None)
        elif typ == "REAL":
            values.append(_as_float(v))
        elif typ == "INTEGER":
            values.append(_as_int(v))
        else:
            values.append(str(v))
    for key in _JSON_RESULT_KEYS:
        values.append(to_json(result.get(key)))
    intro = introduced_error if introduced_error is not None else result.get("introduced_error")
    prop = propagated_error if propagated_error is not None else result.get("propagated_error")
    values.append(_as_float(intro))
    values.append(_as_float(prop))
    known = set(METRIC_COLUMNS) | set(_JSON_RESULT_KEYS) | set(_KEY_FIELDS)
    extra = {k: v for k, v in result.items() if k not in known}
    values.append(to_json(extra) if extra else None)
    full = dict(result)
    full["checkpoint"], full["layer"] = checkpoint, layer
    if intro is not None:
        full["introduced_error"] = intro
    if prop is not None:
        full["propagated_error"] = prop
    values.append(to_json(full))
    values.append(now)
    values.append(now)
    return tuple(values)


# --------------------------------------------------------------------------------------------
# the manager
# --------------------------------------------------------------------------------------------


class DatabaseManager:
    """Owns one SQLite database file: schema, connections, transactions, and the typed queries.

    Args:
        database_path: the database file (``~`` expanded; parent directories created). Pass the
            value of ``config["database_path"]`` (see :func:`debug_framework.config.default_database_path`).
        busy_timeout_s: how long SQLite itself waits for a lock before reporting busy.
        max_retry_s: how long a busy transaction is retried (with backoff) before DatabaseError.
        initialize: create / migrate the schema on construction (default). Pass ``False`` to
            inspect an old file first and call :meth:`migrate_schema` yourself.

    Thread-safe: each thread (and each process, after fork) gets its own connection.
    """

    def __init__(
        self,
        database_path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = 10.0,
        max_retry_s: float = 120.0,
        initialize: bool = True,
    ) -> None:
        raw = str(database_path)
        if not raw or raw == ":memory:" or raw.startswith("file:"):
            raise DatabaseError(
                f"database path {raw!r} is not a file path",
                hint="pass a file path; sessions are shared between threads and processes through the file",
                database=raw,
            )
        path = Path(raw).expanduser().resolve()
        package_dir = Path(__file__).resolve().parents[1]
        if path == package_dir or package_dir in path.parents:
            raise DatabaseError(
                "refusing to put the database inside the installed package",
                hint="set config['database_path'] (default ~/.pie/debug/debug_framework.db) elsewhere",
                database=str(path),
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(
                f"cannot create the database directory: {exc}", database=str(path)
            ) from exc
        self.database_path = path
        self.busy_timeout_s = float(busy_timeout_s)
        self.max_retry_s = float(max_retry_s)
        self._local = threading.local()
        self._all: list[tuple[int, sqlite3.Connection]] = []
        self._all_lock = threading.Lock()
        self._closed = False
        if initialize:
            self.create_tables()

    # A manager can be handed to another process (multiprocessing spawn/fork): only the settings
    # travel; the new process opens its own connections.
    def __getstate__(self) -> dict[str, Any]:
        return {"database_path": self.database_path, "busy_timeout_s": self.busy_timeout_s,
                "max_retry_s": self.max_retry_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["database_path"], busy_timeout_s=state["busy_timeout_s"],  # type: ignore[misc]
                      max_retry_s=state["max_retry_s"], initialize=False)

    def __repr__(self) -> str:
        return f"DatabaseManager({str(self.database_path)!r})"

    # ---------------------------------------------------------------- connections

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self.database_path),
            timeout=self.busy_timeout_s,
            isolation_level=None,  # autocommit; writes use explicit BEGIN IMMEDIATE
            check_same_thread=False,  # only its own thread uses it; close() may run elsewhere
        )
        conn.row_factory = sqlite3.Row
        ms = int(self.busy_timeout_s * 1000)
        conn.execute(f"PRAGMA busy_timeout = {ms}")  # an int we computed: PRAGMA takes no parameters
        conn.execute("PRAGMA foreign_keys = ON")
        mode = self._retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0], "enable WAL")
        if str(mode).lower() != "wal":
            raise DatabaseError(
                f"could not switch the database to WAL mode (got {mode!r})",
                hint="put the database on a local file system that supports shared memory (not NFS)",
                database=str(self.database_path),
            )
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def get_connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use; reopened after ``fork``)."""
        if self._closed:
            raise DatabaseError("the DatabaseManager was closed", database=str(self.database_path),
                                hint="create a new DatabaseManager")
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            try:
                conn = self._open()
            except sqlite3.Error as exc:
                raise self._wrap(exc, "open the database") from exc
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._all_lock:
                self._all.append((os.getpid(), conn))
        return conn

    def close(self) -> None:
        """Close every connection this manager opened in this process (after a fork, connections
        inherited from the parent are left alone: closing them in the child is unsafe in SQLite)."""
        pid = os.getpid()
        with self._all_lock:
            mine = [c for p, c in self._all if p == pid]
            self._all = []
        for c in mine:
            try:
                c.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def __enter__(self) -> DatabaseManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- errors and retries

    def _wrap(self, exc: BaseException, what: str) -> DatabaseError | ResourceExhaustedError:
        where = str(self.database_path)
        if _is_disk_full(exc):
            return ResourceExhaustedError(
                f"disk full while trying to {what}: {exc}",
                hint="free disk space or move the database (config['database_path']); completed rows are kept",
                database=where,
            )
        if _is_busy(exc):
            return DatabaseError(
                f"could not {what}: the database stayed locked for {self.max_retry_s:.0f} s ({exc})",
                hint="another process holds a long write transaction; retry later or raise max_retry_s",
                database=where,
            )
        if isinstance(exc, sqlite3.IntegrityError):
            return DatabaseError(f"could not {what}: constraint violated ({exc})", database=where,
                                 hint="check the session/recording ids exist and values are allowed")
        return DatabaseError(f"could not {what}: {exc}", database=where)

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        deadline = time.monotonic() + self.max_retry_s
        delay = 0.002
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 0.2)

    def run_in_transaction(self, fn: Callable[[sqlite3.Connection], T], what: str = "write to the database") -> T:
        """Run ``fn(conn)`` inside one ``BEGIN IMMEDIATE`` transaction; commit, or roll back and raise.

        Busy/locked failures roll back and re-run ``fn`` (it must only touch the database). Called
        while this thread is already in a transaction, ``fn`` joins it.
        """
        conn = self.get_connection()
        if conn.in_transaction:
            return fn(conn)

        def attempt() -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(conn)
                conn.execute("COMMIT")
                return out
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        try:
            return self._retry(attempt, what)
        except sqlite3.Error as exc:
            raise self._wrap(exc, what) from exc

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``with db.transaction() as conn:`` one atomic state change (BEGIN IMMEDIATE ... COMMIT).

        Taking the write lock at BEGIN means later statements do not meet SQLITE_BUSY; the BEGIN
        itself is retried with backoff. Nested use joins the outer transaction.
        """
        conn = self.get_connection()
        if conn.in_transaction:
            yield conn
            return
        try:
            self._retry(lambda: conn.execute("BEGIN IMMEDIATE"), "begin a transaction")
        except sqlite3.Error as exc:
            raise self._wrap(exc, "begin a transaction") from exc
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            self._retry(lambda: conn.execute("COMMIT"), "commit")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self._wrap(exc, "commit a transaction") from exc

    def _read(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        conn = self.get_connection()
        try:
            return self._retry(lambda: fn(conn), what)
        except sqlite3.Error as exc:
            raise self._wrap(exc, what) from exc

    def execute_query(self, query: str, parameters: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        """Run one parameterised statement.

        Returns a list of dicts for statements that return rows (SELECT, ... RETURNING), else the
        number of rows changed. Writes run in their own transaction (or join the current one).
        """
        head = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
        if head in ("SELECT", "PRAGMA", "EXPLAIN", "WITH") and "RETURNING" not in query.upper():
            return self._read(lambda c: [dict(r) for r in c.execute(query, parameters).fetchall()], "run a query")

        def write(c: sqlite3.Connection) -> Any:
            cur = c.execute(query, parameters)
            if cur.description is not None:
                return [dict(r) for r in cur.fetchall()]
            return cur.rowcount

        return self.run_in_transaction(write, "run a statement")

    # ---------------------------------------------------------------- schema

    def schema_version(self) -> int:
        """The version of the file on disk (0 for a file with no ``schema_version`` table)."""
        return self._read(self._version_of, "read the schema version")

    @staticmethod
    def _version_of(conn: sqlite3.Connection) -> int:
        if not _table_exists(conn, "schema_version"):
            return 0
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def create_tables(self) -> bool:
        """Create the schema if the file is new, or bring an older one up to date. Idempotent."""
        return self.migrate_schema()

    def migrate_schema(self) -> bool:
        """Walk the file up one version at a time to :data:`SCHEMA_VERSION`; ``True`` when current.

        Each step runs in its own ``BEGIN IMMEDIATE`` transaction and re-reads the version inside
        it, so processes opening the same old file at once apply every step exactly once. A failed
        step rolls back, leaving the file at the previous version with its data intact.
        """
        conn = self.get_connection()
        current = self.schema_version()
        if current > SCHEMA_VERSION:
            raise DatabaseError(
                f"the database has schema version {current}, newer than this code's {SCHEMA_VERSION}",
                hint="upgrade multi-backend-debug-framework, or point database_path at another file",
                database=str(self.database_path),
            )
        while current < SCHEMA_VERSION:
            target = current + 1
            step = _MIGRATIONS[target]
            # foreign key enforcement off while tables are rebuilt; the PRAGMA is a no-op inside a
            # transaction, so it is set around it, and the result is verified before commit.
            conn.execute("PRAGMA foreign_keys = OFF")
            try:
                def apply(c: sqlite3.Connection, target: int = target, step: Callable = step) -> int:
                    now_v = self._version_of(c)
                    if now_v >= target:
                        return now_v  # another process did it while we waited for the lock
                    step(c)
                    bad = c.execute("PRAGMA foreign_key_check").fetchall()
                    if bad:
                        raise DatabaseError(
                            f"migration to version {target} left {len(bad)} rows with broken references",
                            database=str(self.database_path),
                            hint="the file was rolled back; report this with a copy of the database",
                        )
                    c.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (target, utc_now()))
                    return target

                current = self.run_in_transaction(apply, f"migrate the schema to version {target}")
            finally:
                conn.execute("PRAGMA foreign_keys = ON")
        return True

    # ---------------------------------------------------------------- sessions

    def create_session(
        self,
        model_path: str,
        reference_backend: str,
        alternative_backend: str,
        *,
        config: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        weights_digest: str | None = None,
        reference_backend_info: Mapping[str, Any] | None = None,
        alternative_backend_info: Mapping[str, Any] | None = None,
        tolerances: Mapping[str, Any] | None = None,
        seed: int | None = None,
        inputs_ref: str | None = None,
        environment: Mapping[str, Any] | None = None,
        created_at: str | None = None,
    ) -> str:
        """Insert a session in status ``created``; returns its id (a new uuid4 hex unless given)."""
        sid = session_id or uuid.uuid4().hex
        now = utc_now()
        params = (
            sid, str(model_path), weights_digest, str(reference_backend), to_json(reference_backend_info),
            str(alternative_backend), to_json(alternative_backend_info), to_json(dict(config or {})),
            to_json(tolerances), _as_int(seed), inputs_ref, to_json(environment), "created",
            created_at or now, now,
        )
        self.run_in_transaction(
            lambda c: c.execute(
                "INSERT INTO sessions (session_id, model_path, weights_digest, reference_backend,"
                " reference_backend_info, alternative_backend, alternative_backend_info, config, tolerances,"
                " seed, inputs_ref, environment, status, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                params,
            ),
            f"create session {sid}",
        )
        return sid

    _SESSION_MUTABLE = (
        "model_path", "weights_digest", "reference_backend", "reference_backend_info", "alternative_backend",
        "alternative_backend_info", "config", "tolerances", "seed", "inputs_ref", "environment", "results",
    )
    _SESSION_JSON = {"reference_backend_info", "alternative_backend_info", "config", "tolerances", "environment",
                     "results"}

    def update_session(self, session_id: str, **fields: Any) -> None:
        """Update provenance fields / ``results`` of a session (not its status: see update_session_status)."""
        unknown = set(fields) - set(self._SESSION_MUTABLE)
        if unknown:
            raise ValueError(f"not updatable session fields: {sorted(unknown)}; status goes through update_session_status")
        if not fields:
            return
        cols = sorted(fields)
        values = [to_json(fields[c]) if c in self._SESSION_JSON else fields[c] for c in cols]
        # column names come from the fixed whitelist above; values are parameters
        sql = "UPDATE sessions SET " + ", ".join(f"{c} = ?" for c in cols) + ", updated_at = ? WHERE session_id = ?"

        def do(c: sqlite3.Connection) -> None:
            if c.execute(sql, (*values, utc_now(), session_id)).rowcount != 1:
                raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                    database=str(self.database_path), hint="create the session first")

        self.run_in_transaction(do, f"update session {session_id}")

    def update_session_status(self, session_id: str, status: str, error_message: str | None = None) -> str:
        """Move a session to ``status`` (checked against :data:`STATUS_TRANSITIONS`, atomically).

        Returns the previous status. Sets ``started_at`` on ``running`` and ``finished_at`` on a
        terminal status. Raises ValidationError for a transition that is not allowed.
        """
        if status not in SESSION_STATUSES:
            raise ValidationError(f"unknown session status {status!r}", session=session_id,
                                  hint=f"use one of {', '.join(SESSION_STATUSES)}")

        def do(c: sqlite3.Connection) -> str:
            row = c.execute("SELECT status FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                    database=str(self.database_path), hint="create the session first")
            old = row[0]
            if status not in STATUS_TRANSITIONS[old]:
                raise ValidationError(
                    f"session status cannot go from {old!r} to {status!r}",
                    session=session_id,
                    hint="allowed: created->running|error, running->passed|failed|error; finished sessions are final",
                )
            now = utc_now()
            c.execute(
                "UPDATE sessions SET status = ?, updated_at = ?,"
                " started_at = CASE WHEN ? = 'running' THEN ? ELSE started_at END,"
                " finished_at = CASE WHEN ? IN ('passed','failed','error') THEN ? ELSE finished_at END,"
                " error_message = COALESCE(?, error_message)"
                " WHERE session_id = ?",
                (status, now, status, now, status, now, error_message, session_id),
            )
            return old

        return self.run_in_transaction(do, f"set session {session_id} to {status}")

    @staticmethod
    def _session_row_to_dict(row: sqlite3.Row) -> dict[str, Any]:
        d = dict(row)
        for key in DatabaseManager._SESSION_JSON:
            d[key] = from_json(d.get(key))
        return d

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """The session row as a dict (JSON columns decoded), or None."""
        row = self._read(
            lambda c: c.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone(),
            f"read session {session_id}",
        )
        return None if row is None else self._session_row_to_dict(row)

    def list_sessions(
        self,
        *,
        model_path: str | None = None,
        status: str | None = None,
        reference_backend: str | None = None,
        alternative_backend: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Sessions, newest first, optionally filtered."""
        where, params = [], []
        for col, val in (("model_path", model_path), ("status", status), ("reference_backend", reference_backend),
                         ("alternative_backend", alternative_backend)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        sql = "SELECT * FROM sessions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, session_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self._read(lambda c: c.execute(sql, params).fetchall(), "list sessions")
        return [self._session_row_to_dict(r) for r in rows]

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and (by cascade) its results, recordings and comparisons."""
        n = self.run_in_transaction(
            lambda c: c.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,)).rowcount,
            f"delete session {session_id}",
        )
        return n == 1

    # ---------------------------------------------------------------- checkpoint results

    def add_checkpoint_result(
        self,
        session_id: str,
        result: Mapping[str, Any],
        *,
        checkpoint: str | None = None,
        layer: int | None | object = ...,
        introduced_error: float | None = None,
        propagated_error: float | None = None,
    ) -> None:
        """Store (or replace) the row of one ``(checkpoint, layer)`` of a session.

        ``result`` is a ``ComparisonResult.to_dict()``-shaped mapping; ``checkpoint``/``layer``
        default to its ``checkpoint``/``layer`` keys. Unknown keys go to the ``extra`` JSON column;
        the whole dict is kept losslessly in ``metrics_json`` (NaN included).
        """
        self.add_checkpoint_results(
            session_id, [result], checkpoint=checkpoint, layer=layer,
            introduced_error=introduced_error, propagated_error=propagated_error,
        )

    def add_checkpoint_results(
        self,
        session_id: str,
        results: Iterable[Mapping[str, Any]],
        *,
        checkpoint: str | None = None,
        layer: int | None | object = ...,
        introduced_error: float | None = None,
        propagated_error: float | None = None,
    ) -> int:
        """Store many result dicts of one session in ONE transaction. Returns how many."""
        rows = []
        for result in results:
            if not isinstance(result, Mapping):
                raise ValidationError(f"a checkpoint result must be a mapping, got {type(result).__name__}",
                                      session=session_id, hint="pass ComparisonResult.to_dict()")
            cp = checkpoint if checkpoint is not None else result.get("checkpoint")
            if not cp:
                raise ValidationError("a checkpoint result has no checkpoint name", session=session_id,
                                      hint="pass checkpoint= or include the 'checkpoint' key")
            ly = result.get("layer") if layer is ... else layer
            ly = None if ly is None else int(ly)  # type: ignore[arg-type]
            rows.append(_result_row_values(session_id, result, str(cp), ly, introduced_error, propagated_error,
                                           utc_now()))

        def do(c: sqlite3.Connection) -> int:
            if c.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
                raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                    database=str(self.database_path), hint="create the session first")
            c.executemany(_UPSERT_RESULT_SQL, rows)
            c.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (utc_now(), session_id))
            return len(rows)

        return self.run_in_transaction(do, f"store checkpoint results of session {session_id}")

    def get_checkpoint_results(self, session_id: str) -> list[dict[str, Any]]:
        """The session's result dicts in the order first written (the model's order).

        Each is the stored dict (exactly as given, NaN kept) plus ``id``, ``session_id``,
        ``checkpoint``, ``layer``, ``introduced_error``, ``propagated_error``, timestamps.
        """
        rows = self._read(
            lambda c: c.execute(
                "SELECT id, session_id, checkpoint, layer, introduced_error, propagated_error, metrics_json,"
                " created_at, updated_at FROM checkpoint_results WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall(),
            f"read checkpoint results of session {session_id}",
        )
        out = []
        for r in rows:
            d = from_json(r["metrics_json"]) or {}
            d.update(id=r["id"], session_id=r["session_id"], checkpoint=r["checkpoint"], layer=r["layer"],
                     created_at=r["created_at"], updated_at=r["updated_at"])
            d.setdefault("introduced_error", r["introduced_error"])
            d.setdefault("propagated_error", r["propagated_error"])
            out.append(d)
        return out

    # ---------------------------------------------------------------- tensor recordings / comparisons

    def add_tensor_recording(self, record: Mapping[str, Any]) -> str:
        """Insert a tensor_recordings row (keys as the columns); returns the recording id."""
        rid = str(record.get("recording_id") or uuid.uuid4().hex)
        side = record.get("side")
        if side is not None and side not in RECORDING_SIDES:
            raise ValidationError(f"unknown recording side {side!r}", hint=f"use one of {RECORDING_SIDES}")
        params = (
            rid, record["session_id"], str(record.get("tensor_name") or ""), record.get("checkpoint"),
            _as_int(record.get("layer")), side, record.get("content_hash"), to_json(record.get("shape")),
            None if record.get("dtype") is None else str(record.get("dtype")), _as_int(record.get("nbytes")),
            str(record["path"]), _as_float(record.get("score")), to_json(record.get("metadata")),
            str(record.get("created_at") or utc_now()),
        )
        self.run_in_transaction(
            lambda c: c.execute(
                "INSERT INTO tensor_recordings (recording_id, session_id, tensor_name, checkpoint, layer, side,"
                " content_hash, shape, dtype, nbytes, path, score, metadata, created_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                params,
            ),
            f"record tensor {rid}",
        )
        return rid

    @staticmethod
    def _recording_row(row: sqlite3.Row) -> dict[str, Any]:
        d = dict(row)
        d["shape"] = from_json(d["shape"])
        d["metadata"] = from_json(d["metadata"])
        return d

    def get_tensor_recordings(self, session_id: str) -> list[dict[str, Any]]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT * FROM tensor_recordings WHERE session_id = ? ORDER BY created_at, recording_id",
                (session_id,),
            ).fetchall(),
            f"read tensor recordings of session {session_id}",
        )
        return [self._recording_row(r) for r in rows]

    def get_tensor_recording(self, recording_id: str) -> dict[str, Any] | None:
        row = self._read(
            lambda c: c.execute("SELECT * FROM tensor_recordings WHERE recording_id = ?", (recording_id,)).fetchone(),
            f"read tensor recording {recording_id}",
        )
        return None if row is None else self._recording_row(row)

    def referenced_content_hashes(self) -> set[str]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT DISTINCT content_hash FROM tensor_recordings WHERE content_hash IS NOT NULL"
            ).fetchall(),
            "list referenced tensor files",
        )
        return {r[0] for r in rows}

    def add_tensor_comparison(self, record: Mapping[str, Any]) -> str:
        cid = str(record.get("comparison_id") or uuid.uuid4().hex)
        params = (
            cid, record["session_id"], record.get("checkpoint"), _as_int(record.get("layer")),
            record.get("reference_recording_id"), record.get("alternative_recording_id"),
            int(bool(record["match_status"])), _as_float(record.get("max_absolute_error")),
            _as_float(record.get("max_relative_error")), to_json(record.get("tolerance_config")),
            to_json(record.get("metrics")), str(record.get("created_at") or utc_now()),
        )
        self.run_in_transaction(
            lambda c: c.execute(
                "INSERT INTO tensor_comparisons (comparison_id, session_id, checkpoint, layer,"
                " reference_recording_id, alternative_recording_id, match_status, max_absolute_error,"
                " max_relative_error, tolerance_config, metrics_json, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                params,
            ),
            f"store tensor comparison {cid}",
        )
        return cid

    def get_tensor_comparisons(self, session_id: str) -> list[dict[str, Any]]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT * FROM tensor_comparisons WHERE session_id = ? ORDER BY created_at, comparison_id",
                (session_id,),
            ).fetchall(),
            f"read tensor comparisons of session {session_id}",
        )
        out = []
        for r in rows:
            d = dict(r)
            d["match_status"] = bool(d["match_status"])
            d["tolerance_config"] = from_json(d["tolerance_config"])
            d["metrics"] = from_json(d.pop("metrics_json"))
            out.append(d)
        return out

    # ---------------------------------------------------------------- batch jobs (resumable)

    def create_batch_job(self, model_paths: Sequence[str], config: Mapping[str, Any] | None = None,
                         *, job_id: str | None = None) -> str:
        """Create a job with one pending item per model path. Re-creating an existing job id is a
        no-op (so a restarted job resumes its items)."""
        jid = job_id or uuid.uuid4().hex

        def do(c: sqlite3.Connection) -> None:
            now = utc_now()
            if c.execute("SELECT 1 FROM batch_jobs WHERE job_id = ?", (jid,)).fetchone():
                return
            c.execute("INSERT INTO batch_jobs (job_id, config, status, created_at, updated_at) VALUES (?,?,?,?,?)",
                      (jid, to_json(dict(config or {})), "pending", now, now))
            c.executemany(
                "INSERT INTO batch_job_items (job_id, item_index, model_path, status, updated_at) VALUES (?,?,?,?,?)",
                [(jid, i, str(p), "pending", now) for i, p in enumerate(model_paths)],
            )

        self.run_in_transaction(do, f"create batch job {jid}")
        return jid

    def get_batch_job(self, job_id: str) -> dict[str, Any] | None:
        def rd(c: sqlite3.Connection) -> tuple[Any, list[Any]]:
            job = c.execute("SELECT * FROM batch_jobs WHERE job_id = ?", (job_id,)).fetchone()
            items = c.execute("SELECT * FROM batch_job_items WHERE job_id = ? ORDER BY item_index",
                              (job_id,)).fetchall()
            return job, items

        job, items = self._read(rd, f"read batch job {job_id}")
        if job is None:
            return None
        d = dict(job)
        d["config"] = from_json(d["config"])
        d["items"] = [dict(i) for i in items]
        return d

    def update_batch_job_status(self, job_id: str, status: str) -> None:
        if status not in BATCH_JOB_STATUSES:
            raise ValidationError(f"unknown batch job status {status!r}", hint=f"use one of {BATCH_JOB_STATUSES}")
        self.run_in_transaction(
            lambda c: c.execute("UPDATE batch_jobs SET status = ?, updated_at = ? WHERE job_id = ?",
                                (status, utc_now(), job_id)),
            f"update batch job {job_id}",
        )

    def update_batch_item(self, job_id: str, item_index: int, *, status: str, session_id: str | None = None,
                          error_message: str | None = None) -> None:
        """Record an item's progress; ``session_id`` links the finished session (same transaction)."""
        if status not in BATCH_ITEM_STATUSES:
            raise ValidationError(f"unknown batch item status {status!r}", hint=f"use one of {BATCH_ITEM_STATUSES}")

        def do(c: sqlite3.Connection) -> None:
            n = c.execute(
                "UPDATE batch_job_items SET status = ?, session_id = COALESCE(?, session_id), error_message = ?,"
                " updated_at = ? WHERE job_id = ? AND item_index = ?",
                (status, session_id, error_message, utc_now(), job_id, int(item_index)),
            ).rowcount
            if n != 1:
                raise DatabaseError(f"batch job {job_id!r} has no item {item_index}", database=str(self.database_path))

        self.run_in_transaction(do, f"update batch job {job_id} item {item_index}")

    def claim_batch_item(self, job_id: str) -> dict[str, Any] | None:
        """Atomically take the next pending item of a job (status -> running); None when none is left."""

        def do(c: sqlite3.Connection) -> dict[str, Any] | None:
            row = c.execute(
                "SELECT * FROM batch_job_items WHERE job_id = ? AND status = 'pending' ORDER BY item_index LIMIT 1",
                (job_id,),
            ).fetchone()
            if row is None:
                return None
            c.execute("UPDATE batch_job_items SET status = 'running', updated_at = ? WHERE job_id = ? AND item_index = ?",
                      (utc_now(), job_id, row["item_index"]))
            d = dict(row)
            d["status"] = "running"
            return d

        return self.run_in_transaction(do, f"claim an item of batch job {job_id}")
