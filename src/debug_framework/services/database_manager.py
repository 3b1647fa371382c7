"""The spec's import path of ``DatabaseManager`` (``debug_framework.services.database_manager``).

``DatabaseManager`` is a face, defined in :mod:`debug_framework.compat`: a
:class:`~debug_framework.storage.database.Database` with the spec's flat methods, each one call to
a store (``get_session`` is ``db.sessions.get`` ...). The project's own code opens a ``Database``
and calls its stores (``docs/storage.md``). The constants are the storage layer's, re-exported for
the users of this path.
"""

from __future__ import annotations

from ..compat import DatabaseManager
from ..storage.checkpoint_rows import METRIC_COLUMNS
from ..storage.schema import (
    BATCH_ITEM_STATUSES,
    BATCH_JOB_STATUSES,
    RECORDING_SIDES,
    SCHEMA_VERSION,
    SESSION_STATUSES,
)
from ..storage.sessions import STATUS_TRANSITIONS, TERMINAL_STATUSES
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
