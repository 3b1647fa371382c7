"""A checkpoint row's JSON columns are written from members each encoded once
(:func:`~debug_framework.storage.values.json_members`): byte for byte what ``to_json`` gives the
whole row, its unknown keys and each JSON column, whatever the values (non-finite floats, nested
containers out of order, subclasses, objects the default converts)."""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path

import numpy as np
import pytest

from debug_framework.storage.checkpoint_rows import (
    JSON_RESULT_KEYS,
    RESULT_COLUMNS,
    _KNOWN,
    result_row_values,
)
from debug_framework.storage.values import json_members, json_object_text, to_json


class Level(IntEnum):
    HIGH = 3


ODD_VALUES = {
    "nan": float("nan"), "inf": float("inf"), "neg_inf": float("-inf"), "neg_zero": -0.0, "tiny": 5e-324,
    "np_float": np.float64(0.1), "np_int": np.int64(7), "np_array": np.arange(3), "enum": Level.HIGH,
    "true": True, "false": False, "none": None, "big": 2**70, "text": 'é "quoted" \x01\n',
    "nested": {"z": [1, {"b": float("nan"), "a": (1, 2)}], "a": None}, "set": {3, 1}, "path": Path("/x/y"),
    "tuple": (0.5, "a"), "empty": {}, "empty_list": [],
}


@pytest.mark.parametrize("mapping", [ODD_VALUES, {}, {"only": 1.0}, {"b": 1, "a": 2, "ab": 3, "B": 4}])
def test_members_give_to_json_s_text(mapping):
    members = json_members(mapping)
    assert members is not None
    assert json_object_text(members) == to_json(mapping)
    some = [m for m in members if m[0] < "n"]  # a subset of the members is that subset's text
    assert json_object_text(some) == to_json({k: v for k, v in mapping.items() if k < "n"})


@pytest.mark.parametrize("mapping", [{1: "a"}, {"a": 1, 2: "b"}, {None: 1}])
def test_keys_that_are_not_str_are_left_to_to_json(mapping):
    assert json_members(mapping) is None


def test_a_row_s_json_columns_are_to_json_s_text():
    result = {**ODD_VALUES, "checkpoint": "post_mlp", "layer": 1, "step": 2, "passed": False, "rmse": float("nan"),
              "max_abs_error": 0.25, "reason": "over", "worst": [{"index": [0, 1], "abs_error": float("inf")}],
              "tolerance": {"rtol": 0.001, "atol": 0.0}, "first_nonfinite_index": None, "introduced_error": 0.5}
    values = dict(zip(RESULT_COLUMNS, result_row_values("s1", result, "post_mlp", 1, None, 0.125, "now")))
    full = {**result, "checkpoint": "post_mlp", "layer": 1, "introduced_error": 0.5, "propagated_error": 0.125}
    assert values["metrics_json"] == to_json(full)
    assert values["extra"] == to_json({k: v for k, v in result.items() if k not in _KNOWN})
    for key in JSON_RESULT_KEYS:
        assert values[key] == to_json(result.get(key))
    assert values["rmse"] is None and values["max_abs_error"] == 0.25 and values["passed"] == 0
    with pytest.raises(TypeError):  # keys that do not sort: as to_json itself refuses them
        result_row_values("s1", {**result, 7: "x"}, "post_mlp", 1, None, None, "now")


def test_a_container_holding_itself_is_refused_as_to_json_refuses_it():
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        to_json({"a": loop})
    with pytest.raises(ValueError, match="Circular"):
        json_members({"a": loop})
