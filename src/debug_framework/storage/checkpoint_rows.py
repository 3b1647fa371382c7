"""How one checkpoint result dict becomes one ``checkpoint_results`` row (shared by the store and
the 1 -> 2 migration, which re-encodes old rows the same way).

The dict is a ``ComparisonResult.to_dict()``: every metric of :data:`METRIC_COLUMNS` gets its own
column (queryable), ``first_nonfinite_index``/``worst``/``tolerance`` are JSON columns, unknown keys
go to ``extra``, and the whole dict is kept losslessly (NaN included) in ``metrics_json``.

A row's place is ``(session_id, checkpoint, layer_key, step)`` (the table's unique key):
``layer_key`` is the layer (-1 for none, so the key holds no NULL) and ``step`` the decode pass
(0: the prefill, or the only pass of a session that does not decode). The 1 -> 2 migration writes
the version-2 table, which has no ``step`` column (``with_step=False``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from ..errors import ConfigurationError
from .values import as_bool, as_float, as_int, json_members, json_object_text, layer_key, to_json

__all__ = ["METRIC_COLUMNS", "RESULT_COLUMNS", "ROW_KEY", "METRICS_JSON_AT", "EncodedRow", "upsert_result_sql",
           "result_row_values", "row_step"]

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
JSON_RESULT_KEYS = ("first_nonfinite_index", "worst", "tolerance")
#: Keys that identify the row rather than measure anything.
_KEY_FIELDS = ("checkpoint", "layer", "passed", "introduced_error", "propagated_error")
_KNOWN = set(METRIC_COLUMNS) | set(JSON_RESULT_KEYS) | set(_KEY_FIELDS)

RESULT_COLUMNS: tuple[str, ...] = (
    "session_id", "checkpoint", "layer", "layer_key", "step", "passed",
    *METRIC_COLUMNS,
    *JSON_RESULT_KEYS,
    "introduced_error", "propagated_error", "extra", "metrics_json", "created_at", "updated_at",
)
#: Where a row's ``metrics_json`` text (the whole result dict, keys sorted) is in :func:`result_row_values`'s tuple.
METRICS_JSON_AT = RESULT_COLUMNS.index("metrics_json")
#: One row's parameters of :func:`upsert_result_sql`, in :data:`RESULT_COLUMNS` order.
EncodedRow = tuple[object, ...]
#: The unique key of a row (the table's UNIQUE constraint).
ROW_KEY = ("session_id", "checkpoint", "layer_key", "step")
_KEEP_ON_CONFLICT = (*ROW_KEY, "created_at")


def _columns(with_step: bool) -> tuple[str, ...]:
    return RESULT_COLUMNS if with_step else tuple(c for c in RESULT_COLUMNS if c != "step")


def upsert_result_sql(table: str = "checkpoint_results", *, with_step: bool = True) -> str:
    """Insert one row, or replace the measurements of the same ``(session, checkpoint, layer, step)``
    (its ``created_at`` stays, so rows keep the model's order). ``table`` is a schema constant;
    ``with_step=False`` writes the version-2 layout (no ``step``; key ``(session, checkpoint, layer)``)."""
    columns = _columns(with_step)
    key = ", ".join(k for k in ROW_KEY if with_step or k != "step")
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in _KEEP_ON_CONFLICT)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' for _ in columns)}) "
        f"ON CONFLICT ({key}) DO UPDATE SET {updates}"
    )


def row_step(result: Mapping[str, object]) -> int:
    """The ``step`` column of a result dict: its decode ``step`` (0 is the prefill), 0 when it has
    none (a session that does not decode). A step that is not a whole number >= 0 is DF005."""
    step = result.get("step")
    if step is None:
        return 0
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigurationError(f"a checkpoint result's step must be a whole number >= 0, got {step!r}",
                                 hint="step is the decode pass (0: the prefill), or null for a session that does not decode")
    return step


#: each metric column and how a (not None) value becomes its SQL value, by the column's type
_METRIC_CONVERTERS: tuple[tuple[str, Callable[[object], object]], ...] = tuple(
    (col, as_float if typ == "REAL" else as_int if typ == "INTEGER" else str) for col, typ in METRIC_COLUMNS.items())
#: ``"key": `` as a JSON column's member text begins (:func:`.values.json_members`)
_KEY_PREFIX = {key: json.dumps(key) + ": " for key in JSON_RESULT_KEYS}


def result_row_values(
    session_id: str,
    result: Mapping[str, object],
    checkpoint: str,
    layer: int | None,
    introduced_error: float | None,
    propagated_error: float | None,
    now: str,
    *,
    with_step: bool = True,
) -> EncodedRow:
    """The parameters of :func:`upsert_result_sql` for one result dict, in :data:`RESULT_COLUMNS`
    order (without ``step`` when ``with_step`` is False, the version-2 layout)."""
    values: list[object] = [session_id, checkpoint, layer, layer_key(layer)]
    if with_step:
        values.append(row_step(result))
    values.append(as_bool(result.get("passed")))
    get = result.get
    values += [None if (v := get(col)) is None else convert(v) for col, convert in _METRIC_CONVERTERS]
    intro = introduced_error if introduced_error is not None else get("introduced_error")
    prop = propagated_error if propagated_error is not None else get("propagated_error")
    full = dict(result)
    full["checkpoint"], full["layer"] = checkpoint, layer
    if intro is not None:
        full["introduced_error"] = intro
    if prop is not None:
        full["propagated_error"] = prop
    # the JSON columns share their members (the whole row, its JSON keys, the unknown keys): each
    # value is written once, the texts joined from it (what to_json gives each, byte for byte)
    members = json_members(full)
    if members is None:  # a key that is not a str: to_json decides how it reads
        values += [to_json(get(key)) for key in JSON_RESULT_KEYS]
        extra = {k: v for k, v in result.items() if k not in _KNOWN}
        values += [as_float(intro), as_float(prop), to_json(extra) if extra else None, to_json(full), now, now]
        return tuple(values)
    text = dict(members)
    # a JSON column's member of ``full`` is ``result``'s own value (only key fields are set there)
    values += [None if get(key) is None else text[key][len(_KEY_PREFIX[key]):] for key in JSON_RESULT_KEYS]
    extra_members = [m for m in members if m[0] not in _KNOWN]
    values += [as_float(intro), as_float(prop), json_object_text(extra_members) if extra_members else None,
               json_object_text(members), now, now]
    return tuple(values)
