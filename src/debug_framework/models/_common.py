"""Helpers shared by the record classes, the reports and the CLIs: timestamps, how a record finds
its database, atomic file writes. (The one strict-JSON writer is ``comparison.dumps_json``.)"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..services.database_manager import DatabaseManager


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def parse_time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def format_time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="microseconds")


def resolve_db(db: Any) -> DatabaseManager:
    """Accept a DatabaseManager or a database path (opened, schema brought up to date)."""
    from ..services.database_manager import DatabaseManager

    if isinstance(db, DatabaseManager):
        return db
    if isinstance(db, (str, os.PathLike)):
        return DatabaseManager(db)
    from ..errors import DatabaseError

    raise DatabaseError(
        "no database to save to or load from",
        hint="pass db=DatabaseManager(path) (or a database path) to the record or the call",
    )


def write_text_atomic(path: os.PathLike | str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``: a reader never sees a
    half-written file. Creates parent directories; ``OSError`` propagates to the caller."""
    import uuid
    from pathlib import Path

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
