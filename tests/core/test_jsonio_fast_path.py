"""json_safe's fast path for members that are already JSON gives exactly what the general rule gives."""

from __future__ import annotations

import math
from collections import OrderedDict, namedtuple
from datetime import datetime

import numpy as np

from debug_framework.jsonio import JsonValue, dumps_json, json_safe


def _rule(value: object) -> JsonValue:
    """The encoding rule as written before the fast path (one recursive call per member)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): _rule(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rule(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, str | bytes):
        return _rule(tolist())
    return value


def _typed(value: object) -> object:
    """``value`` with every leaf's exact type beside it (``1 == 1.0 == True`` would hide a change)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, repr(value))


class _Name(str):
    def __str__(self) -> str:
        return "renamed"


def test_fast_path_gives_what_the_rule_gives_on_tricky_rows() -> None:
    Point = namedtuple("Point", "x y")
    row = {
        "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "zero": -0.0, "big": 1e308, "int": 3, "bool": True,
        "none": None, "str": "NaN", 7: "int key", _Name("k"): 1.5, "np64": np.float64(0.25), "np_nan": np.float64("nan"),
        "np32": np.float32(1.5), "np_int": np.int64(4), "np_bool": np.bool_(False), "array": np.array([[1.0, np.nan]]),
        "tuple": (1, (2.0, (math.inf, "x")), [None, {"deep": math.nan}]), "named": Point(1.0, math.nan),
        "ordered": OrderedDict(a=math.nan), "when": datetime(2026, 1, 2, 3, 4, 5),
        "list": [math.nan, 1.0, np.float64(math.inf), {"a": [(-math.inf,)]}],
    }
    assert _typed(json_safe(row)) == _typed(_rule(row))
    for value in (row["tuple"], row["list"], math.nan, np.float64(2.0), "s", None, [], {}):
        assert _typed(json_safe(value)) == _typed(_rule(value))
    assert dumps_json(row) == dumps_json(_rule(row))
