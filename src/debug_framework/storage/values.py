"""Column values: timestamps, JSON text and the scalar conversions every store applies.

JSON columns are written with :func:`to_json` (NaN and infinities kept as Python's ``NaN`` /
``Infinity`` tokens; NumPy/torch scalars and arrays, sets, paths and datetimes converted, never
pickled) and read back with :func:`from_json`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from json.encoder import c_make_encoder, encode_basestring_ascii
from datetime import datetime, timezone
from pathlib import Path


from ..errors import ConfigurationError
from ..jsonio import JsonObject, JsonValue

__all__ = [
    "JsonValue", "utc_now", "to_json", "from_json", "as_int", "as_float", "as_bool", "layer_key", "now_utc",
    "parse_time", "format_time", "decode_json_columns", "DAMAGED_KEY", "check_session_id", "session_file",
    "SESSION_ID_PATTERN", "json_members", "json_object_text",
]



def utc_now() -> str:
    """Current UTC time as ISO-8601 with microseconds (sortable as text)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _json_default(obj: object) -> object:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.hex()
    tolist = getattr(obj, "tolist", None)  # numpy scalar -> python scalar; arrays/tensors -> lists
    if callable(tolist):
        return tolist()
    return str(obj)  # dtypes, devices, enums: their readable name


def to_json(value: object) -> str | None:
    """JSON text for a column; ``None`` stays SQL NULL. NaN/Infinity are kept (Python's tokens)."""
    if value is None:
        return None
    return json.dumps(value, default=_json_default, sort_keys=True)


#: what :func:`to_json` writes a container with (its configuration: keys sorted, NaN kept, the same default)
_CONTAINER_ENCODER = json.JSONEncoder(default=_json_default, sort_keys=True)
_float_text = float.__repr__  # what the encoder writes a finite float with
_int_text = int.__repr__
#: ``"key": `` of each key seen, as :func:`to_json` writes it (a row's keys are a few dozen names)
_KEY_TEXT: dict[str, str] = {}
_KEY_TEXT_KEPT = 4096


def _value_text(value: object) -> str:
    """``to_json(value)`` for a value that is not None: plain scalars written here, anything else
    (containers, subclasses, objects the default converts) by the encoder itself."""
    t = type(value)
    if t is float:
        if value - value == 0.0:  # type: ignore[operator]
            return _float_text(value)  # type: ignore[arg-type]
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")  # type: ignore[operator]
    if t is str:
        return encode_basestring_ascii(value)
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return _int_text(value)  # type: ignore[arg-type]
    if c_make_encoder is not None and (t is list or t is dict or t is tuple):
        # the encoder's own C loop, as JSONEncoder.encode builds it (without its Python frames):
        # circular references told (a fresh markers dict), the default, ASCII, separators, keys sorted, NaN kept
        return "".join(c_make_encoder({}, _json_default, encode_basestring_ascii, None, ": ", ", ",
                                      True, False, True)(value, 0))
    return _CONTAINER_ENCODER.encode(value)


def json_members(mapping: Mapping[str, object]) -> list[tuple[str, str]] | None:
    """Each member of ``mapping`` as ``(key, "key": value)`` in :func:`to_json`'s text, keys sorted:
    ``json_object_text(json_members(m)) == to_json(m)``, and a subset of them (in order) is the text
    of that subset of ``m``. A row's JSON columns share their members, so each value is written once
    (a decode's rows are thousands). None where a key is not a ``str`` (:func:`to_json` decides how
    such keys read)."""
    try:
        keys = sorted(mapping)
    except TypeError:  # keys of types that do not compare
        return None
    members: list[tuple[str, str]] = []
    for key in keys:
        if type(key) is not str:
            return None
        prefix = _KEY_TEXT.get(key)
        if prefix is None:
            prefix = encode_basestring_ascii(key) + ": "
            if len(_KEY_TEXT) < _KEY_TEXT_KEPT:
                _KEY_TEXT[key] = prefix
        value = mapping[key]
        t = type(value)
        if value is None:
            members.append((key, prefix + "null"))
        elif t is float and value - value == 0.0:  # type: ignore[operator]
            members.append((key, prefix + _float_text(value)))  # type: ignore[arg-type]
        elif t is str:
            members.append((key, prefix + encode_basestring_ascii(value)))
        else:
            members.append((key, prefix + _value_text(value)))
    return members


def json_object_text(members: Iterable[tuple[str, str]]) -> str:
    """The JSON object of ``members`` (:func:`json_members`' pairs, in their order)."""
    return "{" + ", ".join([text for _, text in members]) + "}"


def from_json(text: str | None) -> JsonValue:
    """The value of a JSON column (``None`` for SQL NULL)."""
    return None if text is None else json.loads(text)


#: The key a decoded row gets when some of its JSON columns could not be decoded (their names).
DAMAGED_KEY = "damaged_json"


def decode_json_columns(row: JsonObject, columns: Iterable[str]) -> JsonObject:
    """Decode ``row``'s JSON ``columns`` in place and return it. A column whose text is not JSON
    (a hand-edited or damaged file) reads as None and is named in ``row["damaged_json"]``, so the
    row still renders and says what it lost, instead of failing the whole read."""
    damaged = []
    for key in columns:
        try:
            row[key] = from_json(row.get(key))
        except (ValueError, TypeError, RecursionError):
            row[key] = None
            damaged.append(key)
    if damaged:
        row[DAMAGED_KEY] = sorted(set(row.get(DAMAGED_KEY) or ()) | set(damaged))
    return row


def as_int(value: object) -> int | None:
    """An INTEGER column value (bools become 0/1)."""
    return None if value is None else int(value)  # type: ignore[call-overload]


def as_float(value: object) -> float | None:
    """A REAL column value; NaN becomes NULL (SQLite would anyway; the JSON copy keeps it)."""
    if value is None:
        return None
    f = float(value)  # type: ignore[arg-type]
    return None if math.isnan(f) else f


def as_bool(value: object) -> int | None:
    """A boolean stored as INTEGER 0/1 (NULL stays NULL)."""
    return None if value is None else int(bool(value))


def layer_key(layer: int | None) -> int:
    """The NOT NULL key column of a row's layer: the layer, ``-1`` for "no layer" (so it differs
    from layer 0 and the unique key holds no NULL)."""
    return -1 if layer is None else int(layer)


def now_utc() -> datetime:
    """Current UTC time (a record's default timestamp)."""
    return datetime.now(timezone.utc)


def parse_time(value: datetime | str | None) -> datetime | None:
    """A timestamp column (ISO-8601 text) as a datetime; datetimes and None pass through."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def format_time(value: datetime | None) -> str | None:
    """A datetime as the ISO-8601 text the timestamp columns hold."""
    return None if value is None else value.isoformat(timespec="microseconds")


#: What a caller-chosen session id may be: it names files (the saved inputs, exports), so a plain
#: name of letters, digits, ``_``, ``-`` and ``.``, starting with a letter or digit, at most 128.
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a plain name (:data:`SESSION_ID_PATTERN`, no ``..``), else ConfigurationError (DF005)."""
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.fullmatch(session_id) or ".." in session_id:
        raise ConfigurationError(f"session id {session_id!r} is not a plain name",
                                 hint="use letters, digits, '_', '-' and '.', starting with a letter or digit "
                                      "(at most 128), or let the framework choose one")
    return session_id


def session_file(directory: str | os.PathLike[str], session_id: str, suffix: str) -> Path:
    """The file ``<directory>/<session_id><suffix>``: the id checked (DF005), the result inside ``directory``."""
    root = Path(directory)
    path = root / f"{check_session_id(session_id)}{suffix}"
    if path.parent != root or os.sep in suffix or "\0" in suffix:
        raise ConfigurationError(f"session file suffix {suffix!r} is not a plain suffix", session=session_id)
    return path
