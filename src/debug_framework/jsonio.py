"""The project's one JSON encoding rule, with no heavy imports (CLIs that must start without torch use it).

:func:`json_safe` makes a strict-JSON copy (non-finite floats as "NaN"/"Infinity"/"-Infinity",
datetimes as ISO strings, NumPy/torch scalars and arrays as lists); :func:`dumps_json` writes it with
keys sorted. Every report, CLI, record export and benchmark of the project writes JSON through
these (the database's JSON columns keep Python's NaN/Infinity tokens, so a row reads back exactly).
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime
from pathlib import Path
from typing import TypeAlias, Union

from .errors import ConfigurationError
from .safefiles import read_strict_json

__all__ = ["JsonValue", "JsonObject", "json_safe", "dumps_json", "read_json_object", "as_float"]

#: A value JSON can carry: what ``json.loads`` returns, what a database JSON column and a report
#: document hold. Recursive: lists and objects hold JSON values again.
JsonValue: TypeAlias = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
#: A JSON object: a stored row, a report document, a session's configuration as recorded.
JsonObject: TypeAlias = dict[str, JsonValue]


#: the exact types :func:`json_safe` keeps as they are (a subclass, ``numpy.float64`` say, takes the general path)
_KEPT: frozenset[type] = frozenset({str, int, bool, type(None)})


def json_safe(value: object) -> JsonValue:
    """A strict-JSON copy: non-finite floats become the strings "NaN", "Infinity", "-Infinity"
    (which JavaScript's ``Number()`` and Python's ``float()`` both read back), datetimes ISO
    strings, NumPy/torch scalars and arrays plain lists. The project's one JSON encoding rule.

    A dict's or list's members that are already JSON (exact ``str``/``int``/``bool``/``None``, a
    finite exact ``float``) are taken as they are without a call per member: a decode's rows are
    thousands of such dicts (the result is the same as the general path's)."""
    if type(value) is dict:
        return {k if type(k) is str else str(k): v if (t := type(v)) in _KEPT or (t is float and v - v == 0.0)
                else json_safe(v) for k, v in value.items()}
    if type(value) is list or type(value) is tuple:
        return [v if (t := type(v)) in _KEPT or (t is float and v - v == 0.0) else json_safe(v) for v in value]
    return _json_safe_any(value)


def _json_safe_any(value: object) -> JsonValue:
    """:func:`json_safe` of any value (the general path: subclasses, scalars, datetimes, arrays)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, str | bytes):
        return json_safe(tolist())
    return value


def dumps_json(value: object, *, indent: int | None = 2) -> str:
    """Strict JSON text of ``value`` through :func:`json_safe`, keys sorted: what every report,
    CLI and benchmark of the project writes."""
    return json.dumps(json_safe(value), indent=indent, sort_keys=True, allow_nan=False, default=str)


def read_json_object(path: str | os.PathLike[str], what: str) -> JsonObject:
    """The JSON object in the file ``path`` (a user's configuration file, called ``what`` in messages).

    Raises:
        ConfigurationError (DF005): the file is not a regular file, cannot be read, is larger than
            :data:`~debug_framework.safefiles.MAX_CONFIG_BYTES`, is not strict UTF-8 JSON (no NaN/Infinity,
            bounded integers and nesting: :func:`~debug_framework.safefiles.read_strict_json`, which names the
            field), or holds something else than an object.
    """
    p = Path(path)
    data = read_strict_json(p, what)
    if not isinstance(data, dict):
        raise ConfigurationError(f"the {what} must hold a JSON object", file=str(p))
    return data


def as_float(value: object) -> float | None:
    """A float, or None for missing / non-numeric values. The strings the JSON forms use for
    non-finite numbers ("NaN", "nan", "Infinity", "inf", ...) are turned back into floats."""
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        table = {"nan": math.nan, "infinity": math.inf, "inf": math.inf, "+inf": math.inf,
                 "-infinity": -math.inf, "-inf": -math.inf}
        if text in table:
            return table[text]
        try:
            return float(text)
        except ValueError:
            return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
