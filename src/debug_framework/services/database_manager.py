"""``DatabaseManager``: the spec's face of the session database (``debug_framework.services.database_manager``).

The work is done below, in :mod:`debug_framework.storage` (see ``docs/storage.md``): the SQL core
(connections, WAL, busy retry, transactions, DF003/DF007 errors), the schema and its migrations,
and one store per kind of data. A ``DatabaseManager`` *is* a
:class:`~debug_framework.storage.database.Database` (so records and stores accept it) and adds the
spec's flat methods, each delegating to one store::

    db = DatabaseManager(config["database_path"])
    sid = db.create_session("m.safetensors", "python_reference", "pytorch")   # -> db.sessions.create
    db.add_checkpoint_results(sid, [r.to_dict() for r in results])          # -> db.checkpoints.add_many
    db.get_session(sid)["status"]                                           # -> db.sessions.get
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

from ..storage.checkpoint_rows import METRIC_COLUMNS
from ..storage.checkpoints import ResultKeys
from ..storage.database import Database
from ..storage.schema import (
    BATCH_ITEM_STATUSES,
    BATCH_JOB_STATUSES,
    RECORDING_SIDES,
    SCHEMA_VERSION,
    SESSION_STATUSES,
)
from ..storage.sessions import STATUS_TRANSITIONS, TERMINAL_STATUSES, SessionFilter, SessionProvenance
from ..storage.values import from_json, to_json, utc_now

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


class DatabaseManager(Database):
    """Owns one database (a SQLite file, or a ``postgresql://`` server): schema, connections,
    transactions, and the typed queries.

    ``DatabaseManager(database_path, *, busy_timeout_s=10.0, max_retry_s=120.0, initialize=True)``

    Args:
        database_path: the database file (``~`` expanded; parent directories created). Pass the
            value of ``config["database_path"]`` (see :func:`debug_framework.config.default_database_path`).
        busy_timeout_s: how long SQLite itself waits for a lock before reporting busy.
        max_retry_s: how long a busy transaction is retried (with backoff) before DatabaseError.
        initialize: create / migrate the schema on construction (default). Pass ``False`` to
            inspect an old file first and call :meth:`migrate_schema` yourself.

    Thread-safe: each thread (and each process, after fork) gets its own connection. The spec's
    ``get_connection``, ``execute_query``, ``create_tables`` and ``migrate_schema`` come from
    :class:`~debug_framework.storage.database.Database`.
    """

    # ---------------------------------------------------------------- sessions (SessionStore)

    def create_session(self, model_path: str, reference_backend: str, alternative_backend: str,
                       **provenance: Unpack[SessionProvenance]) -> str:
        """Insert a session in status ``created``; returns its id (a new uuid4 hex unless given).

        Keywords (all optional): ``config``, ``session_id``, ``weights_digest``,
        ``reference_backend_info``, ``alternative_backend_info``, ``tolerances``, ``seed``,
        ``inputs_ref``, ``environment``, ``created_at``."""
        return self.sessions.create(model_path, reference_backend, alternative_backend, **provenance)

    def update_session(self, session_id: str, **fields: Any) -> None:
        """Update provenance fields / ``results`` of a session (not its status: see update_session_status)."""
        self.sessions.update(session_id, **fields)

    def update_session_status(self, session_id: str, status: str, error_message: str | None = None) -> str:
        """Move a session to ``status`` (checked against :data:`STATUS_TRANSITIONS`); returns the previous one."""
        return self.sessions.update_status(session_id, status, error_message)

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """The session row as a dict (JSON columns decoded), or None."""
        return self.sessions.get(session_id)

    def list_sessions(self, **where: Unpack[SessionFilter]) -> list[dict[str, Any]]:
        """Sessions, newest first, optionally filtered by ``model_path``, ``status``,
        ``reference_backend``, ``alternative_backend``, at most ``limit``."""
        return self.sessions.list(**where)

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and (by cascade) its results, recordings and comparisons."""
        return self.sessions.delete(session_id)

    # ---------------------------------------------------------------- checkpoint results (CheckpointResultStore)

    def add_checkpoint_result(self, session_id: str, result: Mapping[str, Any], **keys: Unpack[ResultKeys]) -> None:
        """Store (or replace) the row of one ``(checkpoint, layer)`` of a session.

        ``result`` is a ``ComparisonResult.to_dict()``-shaped mapping; ``checkpoint=``/``layer=``
        default to its ``checkpoint``/``layer`` keys (``introduced_error=``/``propagated_error=``
        likewise). Unknown keys go to the ``extra`` JSON column; the whole dict is kept losslessly
        in ``metrics_json`` (NaN included).
        """
        self.checkpoints.add_many(session_id, [result], **keys)

    def add_checkpoint_results(self, session_id: str, results: Iterable[Mapping[str, Any]],
                               **keys: Unpack[ResultKeys]) -> int:
        """Store many result dicts of one session in ONE transaction (same keywords). Returns how many."""
        return self.checkpoints.add_many(session_id, results, **keys)

    def get_checkpoint_results(self, session_id: str) -> list[dict[str, Any]]:
        """The session's result dicts in the order first written (the model's order)."""
        return self.checkpoints.for_session(session_id)

    # ---------------------------------------------------------------- tensor recordings / comparisons (RecordingStore)

    def add_tensor_recording(self, record: Mapping[str, Any]) -> str:
        """Insert a tensor_recordings row (keys as the columns); returns the recording id."""
        return self.recordings.add(record)

    def get_tensor_recordings(self, session_id: str) -> list[dict[str, Any]]:
        return self.recordings.for_session(session_id)

    def get_tensor_recording(self, recording_id: str) -> dict[str, Any] | None:
        return self.recordings.get(recording_id)

    def referenced_content_hashes(self) -> set[str]:
        return self.recordings.referenced_content_hashes()

    def add_tensor_comparison(self, record: Mapping[str, Any]) -> str:
        return self.recordings.add_comparison(record)

    def get_tensor_comparisons(self, session_id: str) -> list[dict[str, Any]]:
        return self.recordings.comparisons_for_session(session_id)

    # ---------------------------------------------------------------- batch jobs (BatchQueueStore)

    def create_batch_job(self, model_paths: Sequence[str], config: Mapping[str, Any] | None = None,
                         *, job_id: str | None = None) -> str:
        """Create a job with one pending item per model path (re-creating an existing id is a no-op)."""
        return self.batches.create(model_paths, config, job_id=job_id)

    def get_batch_job(self, job_id: str) -> dict[str, Any] | None:
        return self.batches.get(job_id)

    def update_batch_job_status(self, job_id: str, status: str) -> None:
        self.batches.set_status(job_id, status)

    def update_batch_item(self, job_id: str, item_index: int, *, status: str, session_id: str | None = None,
                          error_message: str | None = None) -> None:
        """Record an item's progress; ``session_id`` links the finished session (same transaction)."""
        self.batches.update_item(job_id, item_index, status=status, session_id=session_id,
                                 error_message=error_message)

    def claim_batch_item(self, job_id: str) -> dict[str, Any] | None:
        """Atomically take the next pending item of a job (status -> running); None when none is left."""
        return self.batches.claim_item(job_id)
