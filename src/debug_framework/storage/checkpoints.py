"""The ``checkpoint_results`` table: one row per ``(session, checkpoint, layer, decode step)``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict, Unpack

from ..jsonio import JsonObject
from ..checkpoint_ids import row_checkpoint_id
from ..config import check_keywords
from ..errors import ConfigurationError
from .checkpoint_rows import METRIC_COLUMNS, EncodedRow, result_row_values, upsert_result_sql
from .core import Row, SqlCore
from .dialect import Connection
from .sessions import SessionStore
from .values import DAMAGED_KEY, decode_json_columns, utc_now

__all__ = ["CheckpointResultStore", "ResultKeys"]


class ResultKeys(TypedDict, total=False):
    """Overrides applied to every result dict of one :meth:`CheckpointResultStore.add_many` call;
    a key left out is taken from each dict (``checkpoint``, ``layer``, ...)."""

    checkpoint: str | None
    layer: int | None
    introduced_error: float | None
    propagated_error: float | None

_UPSERT = upsert_result_sql()


class CheckpointResultStore:
    """Checkpoint results of sessions: upserted in batches, read back in the model's order."""

    def __init__(self, core: SqlCore, sessions: SessionStore) -> None:
        self.core = core
        self.sessions = sessions

    def add_many(self, session_id: str, results: Iterable[Mapping[str, object]], **keys: Unpack[ResultKeys]) -> int:
        """Store (or replace) many ``ComparisonResult.to_dict()``-shaped dicts of one session in ONE
        transaction; returns how many. ``checkpoint``/``layer`` default to each dict's keys."""
        return self.add_encoded(session_id, self.encode_many(session_id, results, **keys))

    def encode_many(self, session_id: str, results: Iterable[Mapping[str, object]],
                    **keys: Unpack[ResultKeys]) -> list[EncodedRow]:
        """The rows :meth:`add_many` writes for ``results``, encoded (:func:`.checkpoint_rows.result_row_values`;
        each row's ``metrics_json`` text at :data:`.checkpoint_rows.METRICS_JSON_AT`), for
        :meth:`add_encoded`: a caller that keeps rows apart by their stored text encodes them once.

        Raises:
            ConfigurationError (DF005): a result is not a mapping or names no checkpoint.
        """
        check_keywords(keys, ResultKeys, "add_checkpoint_results")
        checkpoint = keys.get("checkpoint")
        introduced_error, propagated_error = keys.get("introduced_error"), keys.get("propagated_error")
        rows = []
        for result in results:
            if not isinstance(result, Mapping):
                raise ConfigurationError(f"a checkpoint result must be a mapping, got {type(result).__name__}",
                                         session=session_id, hint="pass ComparisonResult.to_dict()")
            cp = checkpoint if checkpoint is not None else result.get("checkpoint")
            if not cp:
                raise ConfigurationError("a checkpoint result has no checkpoint name", session=session_id,
                                         hint="pass checkpoint= or include the 'checkpoint' key")
            ly = keys["layer"] if "layer" in keys else result.get("layer")
            ly = None if ly is None else int(ly)
            rows.append(result_row_values(session_id, result, str(cp), ly, introduced_error, propagated_error,
                                          utc_now()))
        return rows

    def add_encoded(self, session_id: str, rows: Sequence[EncodedRow]) -> int:
        """Store (or replace) rows :meth:`encode_many` encoded for session ``session_id`` in ONE
        transaction; returns how many."""

        def do(c: Connection) -> int:
            self.sessions.require(c, session_id)
            self.core.executemany(c, _UPSERT, rows)
            self.sessions.touch(c, session_id)
            return len(rows)

        return self.core.run_in_transaction(do, f"store checkpoint results of session {session_id}")

    def for_session(self, session_id: str) -> list[JsonObject]:
        """The session's result dicts in the order first written (the model's order).

        Each is the stored dict (exactly as given, NaN kept) plus ``row_id`` (the table's key),
        ``session_id``, ``checkpoint``, ``layer``, ``step`` (the row's decode pass from its ``step``
        column, 0 the prefill; null, as written, for a session that does not decode),
        ``introduced_error``, ``propagated_error``, timestamps, and ``id``, the checkpoint's
        canonical id (``post_attention:1``, ``post_mlp:1@2``; computed for rows stored before it was).
        """
        rows = self.core.fetch_all(
            "SELECT * FROM checkpoint_results WHERE session_id = ? ORDER BY id",
            (session_id,),
            f"read checkpoint results of session {session_id}",
        )
        out = []
        for r in rows:
            d = _metrics_of(r)
            d.update(row_id=r["id"], session_id=r["session_id"], checkpoint=r["checkpoint"], layer=r["layer"],
                     created_at=r["created_at"], updated_at=r["updated_at"])
            d["step"] = _step_of(r["step"], d.get("step"))
            d["id"] = row_checkpoint_id(d)  # rows written before the canonical id get it too
            d.setdefault("introduced_error", r["introduced_error"])
            d.setdefault("propagated_error", r["propagated_error"])
            out.append(d)
        return out


def _step_of(column: int, stored: object) -> int | None:
    """A row's ``step``: its column; a pass-0 row stored with no step (a session that does not
    decode, or a row older than decode steps) reads null, as its result was written."""
    if column == 0 and not (isinstance(stored, int) and not isinstance(stored, bool)):
        return None
    return int(column)


def _metrics_of(row: Row) -> JsonObject:
    """The result dict kept in ``metrics_json``; when that text is damaged (or not an object), what
    the metric columns hold, with ``damaged_json`` naming the column, so the row still renders."""
    decoded = decode_json_columns({"metrics_json": row["metrics_json"]}, ("metrics_json",))
    if isinstance(decoded["metrics_json"], dict):
        return decoded["metrics_json"]
    if row["metrics_json"] is None:
        return {}
    keys = row.keys()
    d: JsonObject = {col: row[col] for col in (*METRIC_COLUMNS, "passed") if col in keys}
    if d.get("passed") is not None:
        d["passed"] = bool(d["passed"])
    d[DAMAGED_KEY] = ["metrics_json"]
    return d
