"""Typed, bounded reads of ``config.json`` keys: every bad value a DF004 naming the key and the file.

``int("x")``, ``float([1])`` or ``dict("x")`` on a config value raise raw exceptions, and
``bool("false")`` is ``True``; :class:`ConfigReader` accepts only the JSON type a key must have
(an integer is never a bool, a float never ``NaN`` or infinite) within the bounds given.
"""

from __future__ import annotations

import math
from typing import Final, TypeVar

from ..errors import ModelLoadingError
from ..jsonio import JsonObject
from .files import short_repr

__all__ = ["ConfigReader", "MAX_SIZE", "MAX_LAYERS", "MAX_POSITIONS", "REQUIRED"]

#: The largest size (vocab, hidden, heads ...) a config may declare before the weights are looked at.
MAX_SIZE = 2**31 - 1
#: The most layers a config may declare (the largest released models have a few hundred).
MAX_LAYERS = 1 << 16
#: The longest context a config may declare.
MAX_POSITIONS = 1 << 30


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Default of a key that must be present.
REQUIRED: Final = _Required()

_D = TypeVar("_D")


class ConfigReader:
    """Reads keys of one JSON object of ``config.json`` (``prefix`` names a nested object in messages).

    A missing key takes the default given; ``null`` does too where ``nullable`` (as transformers
    treats it), and is a bad value otherwise.
    """

    def __init__(self, data: JsonObject, source: str, prefix: str = "") -> None:
        self.data = data
        self.source = source
        self.prefix = prefix

    def error(self, key: str, why: str) -> ModelLoadingError:
        """A DF004 saying that ``key`` ``why`` (its value is quoted)."""
        value = short_repr(self.data.get(key))
        return ModelLoadingError(f"config.json key {self.prefix + key!r} {why}, got {value}", file=self.source)

    def _get(self, key: str, default: object, nullable: bool) -> tuple[bool, object]:
        """(found, value): ``found`` is False when the default applies."""
        if key not in self.data or (nullable and self.data[key] is None):
            if default is REQUIRED:
                raise ModelLoadingError(f"config.json lacks the required key {self.prefix + key!r}", file=self.source)
            return False, default
        return True, self.data[key]

    def integer(self, key: str, default: _D = REQUIRED, *, lo: int = 1, hi: int = MAX_SIZE,
                nullable: bool = False) -> int | _D:
        """An integer in ``[lo, hi]`` (not a bool, not a float)."""
        found, value = self._get(key, default, nullable)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, "must be an integer")
        if not lo <= value <= hi:
            raise self.error(key, f"must be between {lo} and {hi}")
        return value

    def number(self, key: str, default: _D = REQUIRED, *, lo: float = 0.0, open_lo: bool = False,
               nullable: bool = False, float_only: bool = False) -> float | _D:
        """A finite number ``>= lo`` (``> lo`` when ``open_lo``), as a float. ``float_only``: a JSON
        integer is refused too (transformers' config dataclasses refuse ``0`` where they declare a float)."""
        found, value = self._get(key, default, nullable)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, float if float_only else int | float):
            raise self.error(key, "must be a floating-point number such as 1e-06" if float_only else "must be a number")
        if isinstance(value, int) and abs(value) >= 2**63:
            raise self.error(key, "is out of range")
        out = float(value)
        if not math.isfinite(out):
            raise self.error(key, "must be finite")
        if out < lo or (open_lo and out == lo):
            raise self.error(key, f"must be {'>' if open_lo else '>='} {lo}")
        return out

    def flag(self, key: str, default: bool = False) -> bool:
        """``true`` or ``false`` (transformers refuses ``null`` too)."""
        found, value = self._get(key, default, False)
        if found and not isinstance(value, bool):
            raise self.error(key, "must be true or false")
        return bool(value)

    def text(self, key: str, default: str) -> str:
        """A string."""
        found, value = self._get(key, default, False)
        if found and not isinstance(value, str):
            raise self.error(key, "must be a string")
        return value

    def mapping(self, key: str) -> JsonObject | None:
        """A JSON object, or ``None`` when the key is missing or ``null``."""
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.error(key, "must be a JSON object or null")
        return value
