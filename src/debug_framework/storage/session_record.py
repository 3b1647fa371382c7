"""A stored session row as a typed record: its columns as attributes, defaults decided here once.

:meth:`SessionRecord.from_row` reads what :meth:`~.sessions.SessionStore.get` returns (JSON columns
decoded; a damaged one None and named in ``damaged_json``). Every view reads a session through
this record (with :class:`~debug_framework.services.validation.results.ValidationResult` for what
it measured), never by probing the row's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..jsonio import JsonObject, JsonValue

__all__ = ["SessionRecord"]


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def _object(value: JsonValue) -> JsonObject:
    """A JSON column that holds an object ({} when it is NULL, damaged or not an object)."""
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class SessionRecord:
    """One ``sessions`` row. JSON columns that hold no object read as ``{}``; ``results`` is the
    stored :meth:`ValidationResult.summary` ({} before the run stored one)."""

    session_id: str
    model_path: str = ""
    status: str = "created"
    reference_backend: str = ""
    alternative_backend: str = ""
    weights_digest: str | None = None
    reference_backend_info: JsonObject = field(default_factory=dict)
    alternative_backend_info: JsonObject = field(default_factory=dict)
    config: JsonObject = field(default_factory=dict)
    tolerances: JsonObject = field(default_factory=dict)
    seed: int | None = None
    inputs_ref: str | None = None
    environment: JsonObject = field(default_factory=dict)
    results: JsonObject = field(default_factory=dict)
    error_message: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    #: the JSON columns the store could not decode (shown, so a damaged one is not taken for absent)
    damaged_json: tuple[str, ...] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, JsonValue]) -> SessionRecord:
        """The record of a session row as :meth:`~.sessions.SessionStore.get` returns it."""
        seed, damaged = row.get("seed"), row.get("damaged_json")
        return cls(
            session_id=str(row["session_id"]), model_path=str(row.get("model_path") or ""),
            status=str(row.get("status") or "created"), reference_backend=str(row.get("reference_backend") or ""),
            alternative_backend=str(row.get("alternative_backend") or ""), weights_digest=_text(row.get("weights_digest")),
            reference_backend_info=_object(row.get("reference_backend_info")),
            alternative_backend_info=_object(row.get("alternative_backend_info")),
            config=_object(row.get("config")), tolerances=_object(row.get("tolerances")),
            seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
            inputs_ref=_text(row.get("inputs_ref")), environment=_object(row.get("environment")),
            results=_object(row.get("results")), error_message=_text(row.get("error_message")),
            created_at=_text(row.get("created_at")), updated_at=_text(row.get("updated_at")),
            started_at=_text(row.get("started_at")), finished_at=_text(row.get("finished_at")),
            damaged_json=tuple(str(c) for c in damaged) if isinstance(damaged, list | tuple) else ())
