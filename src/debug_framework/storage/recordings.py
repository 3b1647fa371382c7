"""The ``tensor_recordings`` and ``tensor_comparisons`` tables (the tensor bytes themselves live in
the content-addressed :class:`~debug_framework.storage.tensor_store.TensorStore`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Self

from ..jsonio import JsonObject
from ..errors import ConfigurationError
from .core import Row, SqlCore
from .schema import RECORDING_SIDES
from .values import as_float, as_int, format_time, decode_json_columns, now_utc, parse_time, to_json, utc_now

__all__ = ["RecordingStore", "StoredRecording"]

_INSERT_RECORDING = (
    "INSERT INTO tensor_recordings (recording_id, session_id, tensor_name, checkpoint, layer, side,"
    " content_hash, shape, dtype, nbytes, path, score, metadata, created_at)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_COMPARISON = (
    "INSERT INTO tensor_comparisons (comparison_id, session_id, checkpoint, layer,"
    " reference_recording_id, alternative_recording_id, match_status, max_absolute_error,"
    " max_relative_error, tolerance_config, metrics_json, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)


@dataclass(kw_only=True)
class StoredRecording:
    """One ``tensor_recordings`` row, typed. The bytes live in the tensor store (``path`` is relative
    to its root, ``content_hash`` is their sha256). The record class
    :class:`~debug_framework.models.tensor_recording.TensorRecording` is this row plus its verbs."""

    recording_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    tensor_name: str
    checkpoint: str | None = None
    layer: int | None = None
    side: str | None = None
    content_hash: str | None = None
    shape: list[int] | None = None
    dtype: str | None = None
    nbytes: int | None = None
    path: str = ""
    score: float | None = None
    metadata: JsonObject = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)

    def to_dict(self) -> JsonObject:
        return {
            "recording_id": self.recording_id, "session_id": self.session_id, "tensor_name": self.tensor_name,
            "checkpoint": self.checkpoint, "layer": self.layer, "side": self.side,
            "content_hash": self.content_hash, "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype, "nbytes": self.nbytes, "path": self.path, "score": self.score,
            "metadata": dict(self.metadata), "created_at": format_time(self.created_at),
        }

    def to_row(self) -> JsonObject:
        """The column values :meth:`RecordingStore.add` takes."""
        return self.to_dict()

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Self:
        """An instance of ``cls`` from a row dict (unknown keys ignored)."""
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["created_at"] = parse_time(kwargs.get("created_at")) or now_utc()
        kwargs["metadata"] = kwargs.get("metadata") or {}
        return cls(**kwargs)


def _recording_params(record: Mapping[str, object]) -> tuple[object, ...]:
    side = record.get("side")
    if side is not None and side not in RECORDING_SIDES:
        raise ConfigurationError(f"unknown recording side {side!r}", hint=f"use one of {RECORDING_SIDES}")
    dtype = record.get("dtype")
    return (
        str(record.get("recording_id") or uuid.uuid4().hex), record["session_id"],
        str(record.get("tensor_name") or ""), record.get("checkpoint"), as_int(record.get("layer")), side,
        record.get("content_hash"), to_json(record.get("shape")), None if dtype is None else str(dtype),
        as_int(record.get("nbytes")), str(record["path"]), as_float(record.get("score")),
        to_json(record.get("metadata")), str(record.get("created_at") or utc_now()),
    )


def _recording_from_row(row: Row) -> JsonObject:
    return decode_json_columns(dict(row), ("shape", "metadata"))


def _comparison_from_row(row: Row) -> JsonObject:
    d = dict(row)
    d["match_status"] = bool(d["match_status"])
    d["metrics"] = d.pop("metrics_json")
    return decode_json_columns(d, ("tolerance_config", "metrics"))


class RecordingStore:
    """Rows describing recorded tensors and the comparisons made between them."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def add(self, record: Mapping[str, object]) -> str:
        """Insert a tensor_recordings row (keys as the columns); returns the recording id."""
        return self.add_many([record])[0]

    def add_many(self, records: Iterable[Mapping[str, object]]) -> list[str]:
        """Insert many tensor_recordings rows in ONE transaction; returns their ids."""
        params = [_recording_params(r) for r in records]
        if not params:
            return []
        what = f"record tensor {params[0][0]}" if len(params) == 1 else f"record {len(params)} tensors"
        self.core.run_in_transaction(lambda c: self.core.executemany(c, _INSERT_RECORDING, params), what)
        return [str(p[0]) for p in params]

    def for_session(self, session_id: str) -> list[JsonObject]:
        """The session's recordings, oldest first."""
        rows = self.core.fetch_all(
            "SELECT * FROM tensor_recordings WHERE session_id = ? ORDER BY created_at, recording_id",
            (session_id,), f"read tensor recordings of session {session_id}",
        )
        return [_recording_from_row(r) for r in rows]

    def get(self, recording_id: str) -> JsonObject | None:
        """One recording row, or None."""
        row = self.core.fetch_one("SELECT * FROM tensor_recordings WHERE recording_id = ?", (recording_id,),
                                  f"read tensor recording {recording_id}")
        return None if row is None else _recording_from_row(row)

    def referenced_content_hashes(self) -> set[str]:
        """Every content hash some recording points at (what the tensor store must keep)."""
        rows = self.core.fetch_all(
            "SELECT DISTINCT content_hash FROM tensor_recordings WHERE content_hash IS NOT NULL", (),
            "list referenced tensor files",
        )
        return {r[0] for r in rows}

    def add_comparison(self, record: Mapping[str, object]) -> str:
        """Insert a tensor_comparisons row (``metrics`` goes to ``metrics_json``); returns its id."""
        cid = str(record.get("comparison_id") or uuid.uuid4().hex)
        params = (
            cid, record["session_id"], record.get("checkpoint"), as_int(record.get("layer")),
            record.get("reference_recording_id"), record.get("alternative_recording_id"),
            int(bool(record["match_status"])), as_float(record.get("max_absolute_error")),
            as_float(record.get("max_relative_error")), to_json(record.get("tolerance_config")),
            to_json(record.get("metrics")), str(record.get("created_at") or utc_now()),
        )
        self.core.run_in_transaction(lambda c: self.core.execute(c, _INSERT_COMPARISON, params),
                                     f"store tensor comparison {cid}")
        return cid

    def comparisons_for_session(self, session_id: str) -> list[JsonObject]:
        """The session's tensor comparisons, oldest first."""
        rows = self.core.fetch_all(
            "SELECT * FROM tensor_comparisons WHERE session_id = ? ORDER BY created_at, comparison_id",
            (session_id,), f"read tensor comparisons of session {session_id}",
        )
        return [_comparison_from_row(r) for r in rows]
