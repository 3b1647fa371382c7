"""Helpers shared by the record classes: timestamps and how a record finds its database."""

from __future__ import annotations

import math
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


def json_safe(value: Any) -> Any:
    """A copy with non-finite floats as the strings 'NaN', 'Infinity', '-Infinity' (strict JSON)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, (str, bytes)):
        return json_safe(tolist())
    return value
