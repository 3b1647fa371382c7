"""One database file with its schema and its stores: what the records and the engine talk to.

    db = Database(path)            # schema created / migrated on open
    sid = db.sessions.create("m.safetensors", "python_reference", "pytorch")
    db.checkpoints.add_many(sid, [result.to_dict()])
    db.sessions.update_status(sid, "running")

:class:`~debug_framework.compat.DatabaseManager` (the spec's face, importable from
``debug_framework.services.database_manager``) is this class with the spec's flat methods
(``get_session``, ``add_checkpoint_results`` ...), each one call to a store here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Self, Unpack

from ..errors import DatabaseError
from . import schema
from .batches import BatchQueueStore
from .checkpoints import CheckpointResultStore
from .core import CoreSettings, SqlCore
from .opsweeps import OpSweepStore
from .plugins import PluginStore
from .recordings import RecordingStore
from .sessions import SessionStore

__all__ = ["Database", "open_database", "DatabaseLike"]


class Database(SqlCore):
    """A database file: the SQL core plus one store per kind of data.

    Args:
        database_path: the database file (``~`` expanded; parent directories created).
        initialize: create / migrate the schema on construction (default). Pass ``False`` to
            inspect an old file first and call :meth:`migrate_schema` yourself.
        settings: ``busy_timeout_s`` (default 10), ``max_retry_s`` (default 120), ``dialect``
            (default SQLite): see :class:`~.core.CoreSettings`.

    Attributes:
        sessions, checkpoints, recordings, batches, plugins, opsweeps: the stores (see their modules).
    """

    def __init__(self, database_path: str | os.PathLike[str], *, initialize: bool = True,
                 **settings: Unpack[CoreSettings]) -> None:
        super().__init__(database_path, **settings)
        #: the file the user named: ``database_path`` itself, except for the migrated copy
        #: :meth:`open_read_only` reads an older file through
        self.source_path = self.database_path
        self.sessions = SessionStore(self)
        self.checkpoints = CheckpointResultStore(self, self.sessions)
        self.recordings = RecordingStore(self)
        self.batches = BatchQueueStore(self)
        self.plugins = PluginStore(self)
        self.opsweeps = OpSweepStore(self)
        if initialize and not self.read_only:
            self.migrate_schema()

    @classmethod
    def open_read_only(cls, database_path: str | os.PathLike[str], **settings: Unpack[CoreSettings]) -> Self:
        """Open an existing file for reading only: nothing on disk changes (no journal-mode switch,
        no migration). A file of an older schema version is read through a migrated copy in a
        temporary directory (``source_path`` names the original); a newer one is DatabaseError."""
        db = cls(database_path, initialize=False, **{**settings, "read_only": True})
        try:
            if schema.readable_version(db) == schema.SCHEMA_VERSION:
                return db
            copy = _snapshot(db)
        except BaseException:
            db.close()
            raise
        db.close()
        writable = {k: v for k, v in settings.items() if k != "read_only"}
        try:
            migrated = cls(copy, **writable)  # type: ignore[arg-type]
        except BaseException:
            shutil.rmtree(copy.parent, ignore_errors=True)
            raise
        migrated.close()
        migrated.read_only, migrated.source_path = True, db.database_path  # the copy is only read too
        weakref.finalize(migrated, shutil.rmtree, copy.parent, True)
        return migrated

    # A database can be handed to another process (multiprocessing spawn/fork): only the settings
    # travel (the dialect included); the new process opens its own connections.
    def __getstate__(self) -> dict[str, object]:
        return {"database_path": self.target, "busy_timeout_s": self.busy_timeout_s,
                "max_retry_s": self.max_retry_s, "dialect": self.dialect, "read_only": self.read_only}

    def __setstate__(self, state: dict[str, object]) -> None:
        Database.__init__(self, state["database_path"], busy_timeout_s=state["busy_timeout_s"],
                          max_retry_s=state["max_retry_s"], dialect=state["dialect"],
                          read_only=state.get("read_only", False), initialize=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        """The version of the file on disk (0 for a file with no ``schema_version`` table)."""
        return schema.schema_version(self)

    def migrate_schema(self) -> bool:
        """Walk the file up one version at a time to :data:`~.schema.SCHEMA_VERSION`; ``True`` when current."""
        return schema.migrate(self)

    def create_tables(self) -> bool:
        """Create the schema if the file is new, or bring an older one up to date. Idempotent."""
        return self.migrate_schema()


#: What record methods accept as their database: an open one, or a database file path.
DatabaseLike = Database | str | os.PathLike[str]


def open_database(db: DatabaseLike | None) -> Database:
    """``db`` itself when it is a :class:`Database` (a DatabaseManager is one), else the file at that
    path opened with its schema brought up to date. DatabaseError (DF003) for anything else."""
    if isinstance(db, Database):
        return db
    if isinstance(db, (str, os.PathLike)):
        return Database(db)
    raise DatabaseError(
        "no database to save to or load from",
        hint="pass db=Database(path) (or a database path) to the record or the call",
    )


def _snapshot(db: Database) -> Path:
    """A consistent copy of ``db``'s file (the engine's online backup) in a new temporary directory."""
    directory = Path(tempfile.mkdtemp(prefix="pie-debug-read-"))
    target = directory / db.database_path.name
    try:
        db.read(lambda conn: db.dialect.copy_to(conn, target), "copy the database for reading")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return target
