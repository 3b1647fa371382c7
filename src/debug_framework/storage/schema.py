"""The schema: table layouts (DDL), their enumerations, and the versioned migrations.

The file carries its version in ``schema_version``; :func:`migrate` walks an older file up one
step at a time (0 -> 1 -> 2 -> ... -> 8), each step one write transaction that re-reads the version inside it,
so processes opening the same old file at once apply every step exactly once. A failed step rolls
back, leaving the file at the previous version with its data intact.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import DatabaseError
from .checkpoint_rows import METRIC_COLUMNS, result_row_values, upsert_result_sql
from .core import SqlCore
from .dialect import Connection, Dialect
from .values import from_json, to_json, utc_now

__all__ = [
    "SCHEMA_VERSION",
    "SESSION_STATUSES",
    "RECORDING_SIDES",
    "BATCH_JOB_STATUSES",
    "BATCH_ITEM_STATUSES",
    "schema_version",
    "readable_version",
    "migrate",
]

#: The schema version this code writes. :func:`migrate` brings older files up to it.
SCHEMA_VERSION = 8

SESSION_STATUSES = ("created", "running", "passed", "failed", "error")
RECORDING_SIDES = ("reference", "alternative", "oracle")
BATCH_JOB_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
BATCH_ITEM_STATUSES = ("pending", "running", "done", "failed", "cancelled")


def _one_of(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{s}'" for s in values)  # constants of this module, not user input


_SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER NOT NULL,
    applied_at TEXT    NOT NULL
)"""


def _v1_tables(d: Dialect) -> tuple[str, ...]:
    """Version 1: the first release layout (kept verbatim so old files can be walked forward)."""
    return (
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
        f"""CREATE TABLE checkpoint_results (
        id             {d.autoincrement_pk},
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


def _v2_sessions_sql(d: Dialect, name: str) -> str:
    j = d.json_type
    return f"""CREATE TABLE {name} (
        session_id               TEXT PRIMARY KEY,
        model_path               TEXT NOT NULL,
        weights_digest           TEXT,
        reference_backend        TEXT NOT NULL,
        reference_backend_info   {j},
        alternative_backend      TEXT NOT NULL,
        alternative_backend_info {j},
        config                   {j} NOT NULL DEFAULT '{{}}',
        tolerances               {j},
        seed                     INTEGER,
        inputs_ref               TEXT,
        environment              {j},
        status                   TEXT NOT NULL DEFAULT 'created' CHECK (status IN ({_one_of(SESSION_STATUSES)})),
        error_message            TEXT,
        results                  {j},
        created_at               TEXT NOT NULL,
        updated_at               TEXT NOT NULL,
        started_at               TEXT,
        finished_at              TEXT
    )"""


def _v2_checkpoint_results_sql(d: Dialect, name: str, *, with_step: bool = False) -> str:
    """The ``checkpoint_results`` table: version 2's layout, or with ``with_step`` version 7's
    (a ``step`` column, the decode pass, in the unique key)."""
    metric_cols = ",\n        ".join(f"{col} {typ}" for col, typ in METRIC_COLUMNS.items())
    j = d.json_type
    step_col = "\n        step                  INTEGER NOT NULL DEFAULT 0," if with_step else ""
    step_key = ", step" if with_step else ""
    return f"""CREATE TABLE {name} (
        id                    {d.autoincrement_pk},
        session_id            TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        checkpoint            TEXT NOT NULL,
        layer                 INTEGER,
        layer_key             INTEGER NOT NULL,{step_col}
        passed                INTEGER,
        {metric_cols},
        first_nonfinite_index {j},
        worst                 {j},
        tolerance             {j},
        introduced_error      REAL,
        propagated_error      REAL,
        extra                 {j},
        metrics_json          {j} NOT NULL,
        created_at            TEXT NOT NULL,
        updated_at            TEXT NOT NULL,
        UNIQUE (session_id, checkpoint, layer_key{step_key})
    )"""


def _v2_tensor_recordings_sql(d: Dialect, name: str) -> str:
    return f"""CREATE TABLE {name} (
        recording_id TEXT PRIMARY KEY,
        session_id   TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        tensor_name  TEXT NOT NULL,
        checkpoint   TEXT,
        layer        INTEGER,
        side         TEXT CHECK (side IS NULL OR side IN ({_one_of(RECORDING_SIDES)})),
        content_hash TEXT,
        shape        {d.json_type},
        dtype        TEXT,
        nbytes       INTEGER,
        path         TEXT NOT NULL,
        score        REAL,
        metadata     {d.json_type},
        created_at   TEXT NOT NULL
    )"""


def _v2_new_tables(d: Dialect) -> tuple[str, ...]:
    j = d.json_type
    return (
        f"""CREATE TABLE tensor_comparisons (
        comparison_id            TEXT PRIMARY KEY,
        session_id               TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        checkpoint               TEXT,
        layer                    INTEGER,
        reference_recording_id   TEXT REFERENCES tensor_recordings(recording_id) ON DELETE SET NULL,
        alternative_recording_id TEXT REFERENCES tensor_recordings(recording_id) ON DELETE SET NULL,
        match_status             INTEGER NOT NULL,
        max_absolute_error       REAL,
        max_relative_error       REAL,
        tolerance_config         {j},
        metrics_json             {j},
        created_at               TEXT NOT NULL
    )""",
        f"""CREATE TABLE batch_jobs (
        job_id     TEXT PRIMARY KEY,
        config     {j} NOT NULL DEFAULT '{{}}',
        status     TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status IN ({_one_of(BATCH_JOB_STATUSES)})),
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
        f"""CREATE TABLE batch_job_items (
        job_id        TEXT NOT NULL REFERENCES batch_jobs(job_id) ON DELETE CASCADE,
        item_index    INTEGER NOT NULL,
        model_path    TEXT NOT NULL,
        status        TEXT NOT NULL DEFAULT 'pending'
                      CHECK (status IN ({_one_of(BATCH_ITEM_STATUSES)})),
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

# --------------------------------------------------------------------------------------------
# migration steps: each runs inside its own write transaction (see migrate)
# --------------------------------------------------------------------------------------------


def _migrate_0_to_1(core: SqlCore, conn: Connection) -> None:
    """Empty file, or the unversioned prototype (one ``debug_sessions`` table) -> version 1."""
    d = core.dialect
    core.execute(conn, _SCHEMA_VERSION_TABLE)
    for sql in _v1_tables(d):
        core.execute(conn, sql)
    if not d.table_exists(conn, "debug_sessions"):
        return
    cols = set(d.columns(conn, "debug_sessions"))
    now = utc_now()
    for row in core.execute(conn, "SELECT * FROM debug_sessions").fetchall():
        r = {k: row[k] for k in row.keys()}
        status = str(r.get("status") or "created")
        message = None
        if status not in SESSION_STATUSES:
            message = f"migrated from the unversioned layout with unknown status {status!r}"
            status = "error"
        core.execute(
            conn,
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
                str(r.get("created_at") or now),
                now,
            ),
        )
    core.execute(conn, "DROP TABLE debug_sessions")  # its rows now live in sessions


def _copy_sessions_1_to_2(core: SqlCore, conn: Connection) -> None:
    known = _one_of(SESSION_STATUSES)
    core.execute(conn, _v2_sessions_sql(core.dialect, "sessions_v2"))
    core.execute(
        conn,
        "INSERT INTO sessions_v2 (session_id, model_path, reference_backend, alternative_backend, config,"
        " status, results, error_message, created_at, updated_at, finished_at)"
        " SELECT session_id, model_path, reference_backend, alternative_backend, config,"
        f" CASE WHEN status IN ({known}) THEN status ELSE 'error' END,"
        " results,"
        f" CASE WHEN status IN ({known}) THEN error_message"
        "      ELSE COALESCE(error_message, 'migrated from version 1 with unknown status ' || quote(status)) END,"
        " created_at, updated_at,"
        " CASE WHEN status IN ('passed','failed','error') THEN updated_at ELSE NULL END"
        " FROM sessions",
    )


def _copy_checkpoint_results_1_to_2(core: SqlCore, conn: Connection) -> None:
    """Metrics move from the JSON blob into columns; the newest row per key wins."""
    core.execute(conn, _v2_checkpoint_results_sql(core.dialect, "checkpoint_results_v2"))
    old = core.execute(
        conn,
        "SELECT id, session_id, checkpoint, layer, passed, max_abs_error, mean_abs_error, metrics_json, created_at"
        " FROM checkpoint_results ORDER BY id",
    ).fetchall()
    upsert = upsert_result_sql("checkpoint_results_v2", with_step=False)
    for _rid, sid, cp, layer, passed, max_abs, mean_abs, mjson, created in old:
        metrics = from_json(mjson) or {}
        if not isinstance(metrics, dict):
            metrics = {"legacy_metrics": metrics}
        metrics.setdefault("max_abs_error", max_abs)
        metrics.setdefault("mean_abs_error", mean_abs)
        metrics.setdefault("passed", None if passed is None else bool(passed))
        metrics["checkpoint"], metrics["layer"] = cp, layer
        core.execute(conn, upsert, result_row_values(sid, metrics, cp, layer, None, None, created, with_step=False))


def _copy_tensor_recordings_1_to_2(core: SqlCore, conn: Connection) -> None:
    """Structured columns recovered from the metadata JSON where present."""
    core.execute(conn, _v2_tensor_recordings_sql(core.dialect, "tensor_recordings_v2"))
    rows = core.execute(
        conn, "SELECT recording_id, session_id, tensor_name, path, metadata, created_at FROM tensor_recordings"
    ).fetchall()
    for rec_id, sid, name, path, meta, created in rows:
        m = from_json(meta) or {}
        m = m if isinstance(m, dict) else {"legacy_metadata": m}
        core.execute(
            conn,
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


def _migrate_1_to_2(core: SqlCore, conn: Connection) -> None:
    """Version 1 -> 2: full session provenance, every metric as a column, tensor store columns,
    tensor_comparisons, batch jobs. Tables are rebuilt (SQLite cannot add CHECK/UNIQUE in place)."""
    _copy_sessions_1_to_2(core, conn)
    _copy_checkpoint_results_1_to_2(core, conn)
    _copy_tensor_recordings_1_to_2(core, conn)
    for table in ("tensor_recordings", "checkpoint_results", "sessions"):
        core.execute(conn, f"DROP TABLE {table}")
    for table in ("sessions", "checkpoint_results", "tensor_recordings"):
        core.execute(conn, f"ALTER TABLE {table}_v2 RENAME TO {table}")
    for sql in (*_v2_new_tables(core.dialect), *_V2_INDEXES):
        core.execute(conn, sql)


#: Version 3's lease columns (see :mod:`.leases`), added to ``sessions`` and ``batch_job_items``.
_V3_LEASE_COLUMNS = (("owner_host", "TEXT"), ("owner_pid", "INTEGER"), ("owner_token", "TEXT"),
                     ("heartbeat_at", "REAL"), ("lease_expires_at", "REAL"))


def _migrate_2_to_3(core: SqlCore, conn: Connection) -> None:
    """Version 2 -> 3: who owns a running session / batch item (owner and heartbeat lease), and
    when maintenance last ran (``maintenance_runs``). Columns are added in place (all nullable)."""
    for table in ("sessions", "batch_job_items"):
        for col, typ in _V3_LEASE_COLUMNS:  # constants of this module
            core.execute(conn, f"ALTER TABLE {table} ADD COLUMN {col} {typ}")
    core.execute(conn, "CREATE INDEX IF NOT EXISTS idx_batch_items_status ON batch_job_items(status)")
    core.execute(conn, """CREATE TABLE maintenance_runs (
        task        TEXT PRIMARY KEY,
        last_run_at REAL NOT NULL
    )""")



def _migrate_3_to_4(core: SqlCore, conn: Connection) -> None:
    """Version 3 -> 4: the plugin registry's table (``storage.plugins``)."""
    from .plugins import plugin_tables

    for sql in plugin_tables(core.dialect):
        core.execute(conn, sql)


_MIGRATIONS: dict[int, Callable[[SqlCore, Connection], None]] = {1: _migrate_0_to_1, 2: _migrate_1_to_2}
_MIGRATIONS[3] = _migrate_2_to_3
_MIGRATIONS[4] = _migrate_3_to_4


def _migrate_4_to_5(core: SqlCore, conn: Connection) -> None:
    """Version 4 -> 5: work launched from the dashboard and run by a worker process (``storage.tasks``)."""
    from .tasks import task_tables

    for sql in task_tables(core.dialect):
        core.execute(conn, sql)


_MIGRATIONS[5] = _migrate_4_to_5


def _migrate_5_to_6(core: SqlCore, conn: Connection) -> None:
    """Version 5 -> 6: backend conformance sweeps, one row per operator (``storage.opsweeps``)."""
    from .opsweeps import opsweep_tables

    for sql in opsweep_tables(core.dialect):
        core.execute(conn, sql)


_MIGRATIONS[6] = _migrate_5_to_6

#: Version 6 files written while decode steps were new kept a step ``s`` >= 1 inside the row's
#: ``layer_key`` (the layer, or -1, plus ``s`` x 2^20); version 7 takes it out into ``step``.
_V6_STEP_STRIDE = 1 << 20


def _migrate_6_to_7(core: SqlCore, conn: Connection) -> None:
    """Version 6 -> 7: ``checkpoint_results`` gains ``step`` (the decode pass; 0 the prefill) in its
    unique key, so every decode step's row of a checkpoint is a row of its own. The table is rebuilt
    (SQLite cannot change a UNIQUE constraint in place), ids and their order kept; existing rows get
    step 0, except the decode rows of a version 6 file, whose step comes out of ``layer_key``."""
    d = core.dialect
    core.execute(conn, _v2_checkpoint_results_sql(d, "checkpoint_results_v7", with_step=True))
    columns = [c for c in d.columns(conn, "checkpoint_results") if c not in ("layer_key", "step")]
    listed = ", ".join(columns)  # column names read from the schema itself, never user input
    step = f"((layer_key + 1) / {_V6_STEP_STRIDE})"  # integer division on both engines; layer_key >= -1
    core.execute(conn, f"INSERT INTO checkpoint_results_v7 ({listed}, layer_key, step)"
                       f" SELECT {listed}, layer_key - {step} * {_V6_STEP_STRIDE}, {step}"
                       " FROM checkpoint_results ORDER BY id")
    core.execute(conn, "DROP TABLE checkpoint_results")
    core.execute(conn, "ALTER TABLE checkpoint_results_v7 RENAME TO checkpoint_results")
    core.execute(conn, "CREATE INDEX IF NOT EXISTS idx_checkpoint_results_session ON checkpoint_results(session_id, id)")
    d.restart_ids(conn, "checkpoint_results")


_MIGRATIONS[7] = _migrate_6_to_7


def _migrate_7_to_8(core: SqlCore, conn: Connection) -> None:
    """Version 7 -> 8: results stored before the typed result are rewritten in its one shape
    (:mod:`.result_shape`): each checkpoint row's ``metrics_json`` with a nested ``judgement``, each
    session's ``results`` whose isolation entries kept ``mlp_judgement``. No layout changes."""
    from .result_shape import upgrade_row, upgrade_summary

    for table, key, column, upgrade in (("checkpoint_results", "id", "metrics_json", upgrade_row),
                                        ("sessions", "session_id", "results", upgrade_summary)):
        for row in core.execute(conn, f"SELECT {key}, {column} FROM {table} WHERE {column} IS NOT NULL").fetchall():
            try:
                doc = from_json(row[column])
            except ValueError:
                continue  # a damaged document stays as it is; readers name it in damaged_json
            new = upgrade(doc) if isinstance(doc, dict) else None
            if new is not None:
                core.execute(conn, f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (to_json(new), row[key]))


_MIGRATIONS[8] = _migrate_7_to_8

# --------------------------------------------------------------------------------------------
# versions
# --------------------------------------------------------------------------------------------


def _version_of(core: SqlCore, conn: Connection) -> int:
    if not core.dialect.table_exists(conn, "schema_version"):
        return 0
    row = core.execute(conn, "SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def schema_version(core: SqlCore) -> int:
    """The version of the file on disk (0 for a file with no ``schema_version`` table)."""
    return core.read(lambda c: _version_of(core, c), "read the schema version")


def _create_baseline(core: SqlCore, conn: Connection, version: int) -> None:
    """An empty database of an engine with no older files (PostgreSQL: ``dialect.baseline_version``
    = 2) is created at that version directly: SQLite's steps 1 and 2 rebuild tables by name, which
    only old SQLite files need. Later steps run on it like on any file."""
    if version != 2:
        raise ValueError(f"no baseline layout for schema version {version}")
    d = core.dialect
    core.execute(conn, _SCHEMA_VERSION_TABLE)
    for sql in (_v2_sessions_sql(d, "sessions"), _v2_checkpoint_results_sql(d, "checkpoint_results"),
                _v2_tensor_recordings_sql(d, "tensor_recordings"), *_v2_new_tables(d), *_V2_INDEXES):
        core.execute(conn, sql)
    core.execute(conn, "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (1, utc_now()))


def _apply_step(core: SqlCore, target: int) -> int:
    """Run the migration to ``target`` in one transaction (unless another process just did)."""
    baseline = int(getattr(core.dialect, "baseline_version", 0))

    def apply(c: Connection) -> int:
        now_v = _version_of(core, c)
        if now_v >= target:
            return now_v  # another process did it while we waited for the lock
        if now_v == 0 and target <= baseline:
            _create_baseline(core, c, baseline)
            core.execute(c, "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (baseline, utc_now()))
            return baseline
        _MIGRATIONS[target](core, c)
        bad = core.dialect.broken_references(c)
        if bad:
            raise DatabaseError(
                f"migration to version {target} left {bad} rows with broken references",
                database=core.location,
                hint="the file was rolled back; report this with a copy of the database",
            )
        core.execute(c, "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (target, utc_now()))
        return target

    return core.run_in_transaction(apply, f"migrate the schema to version {target}")


def readable_version(core: SqlCore) -> int:
    """The file's schema version; DatabaseError (DF003) for a file newer than this code (left untouched)."""
    current = schema_version(core)
    if current > SCHEMA_VERSION:
        raise DatabaseError(
            f"the database has schema version {current}, newer than this code's {SCHEMA_VERSION}",
            hint="upgrade multi-backend-debug-framework, or point database_path at another file",
            database=core.location,
        )
    return current


def migrate(core: SqlCore) -> bool:
    """Walk the file up one version at a time to :data:`SCHEMA_VERSION`; ``True`` when current.

    Raises DatabaseError (DF003) for a file newer than this code (left untouched) or a step that
    fails (rolled back).
    """
    conn = core.get_connection()
    current = readable_version(core)
    while current < SCHEMA_VERSION:
        # foreign key enforcement off while tables are rebuilt; the setting is a no-op inside a
        # transaction, so it is set around it, and references are verified before commit.
        core.dialect.set_foreign_keys(conn, False)
        try:
            current = _apply_step(core, current + 1)
        finally:
            core.dialect.set_foreign_keys(conn, True)
    return True
