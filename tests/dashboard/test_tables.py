"""The dashboard's tables (issue 30, items 5 and 7): the drill-down's culprit first and marked,
measured numbers in scientific notation (never fixed decimals hiding their precision), empty text
cells empty rather than "None"."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")

from debug_framework.dashboard.charts import drilldown_frame  # noqa: E402
from debug_framework.dashboard.data import NUMBER_FORMAT, cells, number_columns  # noqa: E402

DRILL = json.loads((Path(__file__).resolve().parents[1] / "cli" / "data" / "drilldown_result.json").read_text())


def test_the_culprit_is_the_first_row_and_marked():
    from debug_framework.services.drilldown.types import LayerDrilldown

    (entry,) = DRILL["drilldown"]
    frame = drilldown_frame(LayerDrilldown.from_dict(entry))
    assert frame.iloc[0]["node"] == entry["culprit"]["node"] and bool(frame.iloc[0]["culprit"])
    assert int(frame["culprit"].sum()) == 1 and len(frame) == len(entry["operators"])
    assert list(frame["#"][1:]) == sorted(frame["#"][1:])  # the rest in graph order


def test_numbers_keep_their_precision_and_empty_cells_stay_empty():
    frame = cells(pd.DataFrame([{"checkpoint": "post_mlp:0", "bound": 2.3e-9, "reason": None},
                                {"checkpoint": "post_mlp:1", "bound": 1.7e-8, "reason": "over"}]))
    assert list(frame["reason"]) == ["", "over"]
    config = number_columns(frame)
    assert set(config) == {"bound"} and config["bound"]["type_config"]["format"] == NUMBER_FORMAT == "%.3e"


def test_error_source_and_environment_read_as_words_not_json():
    from debug_framework.reports._common import error_source_text, flat_items
    from debug_framework.services.validation.results import ErrorSource

    assert error_source_text(ErrorSource.from_dict({"kind": "layer", "layer": 1, "block": "attention"})) == \
        "layer 1 (attention)"
    assert error_source_text(ErrorSource.from_dict({"kind": "accumulation", "layer": 3, "confirmed": False})) == \
        "accumulation (first beyond its bound at layer 3) (not confirmed by isolation)"
    items = dict(flat_items({"environment": {"python": "3.11.7", "cuda_available": False, "gpu": None},
                             "reference": {"dtypes": ["float32", "float64"]}}))
    assert items == {"environment.python": "3.11.7", "environment.cuda_available": "False",
                     "environment.gpu": "", "reference.dtypes": "float32, float64"}
