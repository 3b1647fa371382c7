"""The report does not contradict itself (issue 30, item 10): the tolerances section shows first the
rule that judged each checkpoint and says when the allclose tolerances judged nothing; Model
Explorer opens on the margin (checkpoints) and the introduced error (a drilled layer)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from debug_framework.reports._sections import tolerances_section
from debug_framework.reports.model_explorer import write_result_model_explorer
from debug_framework.services.validation.results import CheckpointResult, ValidationResult
from debug_framework.storage.session_record import SessionRecord

DRILL = json.loads((Path(__file__).resolve().parents[1] / "cli" / "data" / "drilldown_result.json").read_text())


def test_the_tolerances_section_names_the_rule_that_judged():
    session = SessionRecord("s", tolerances={"governing_dtype": "float32", "precision_thresholds": {},
                                             "per_checkpoint": {"post_mlp:0": {"rtol": 1e-4, "atol": 1e-5}}})
    calibrated = [CheckpointResult.from_row({"checkpoint": "post_mlp", "layer": i, "passed": True,
                                             "judged_by": "calibration"}) for i in (0, 1)]
    section = tolerances_section(session, calibrated)
    assert re.search(r"<h3>(.*?)</h3>", section).group(1) == "The rule that judged each checkpoint"
    assert "calibrated bound" in section and "2 checkpoint(s): post_mlp:0, post_mlp:1" in section
    assert "No checkpoint was judged by these allclose tolerances" in section
    mixed = [calibrated[0], CheckpointResult.from_row({"checkpoint": "post_mlp", "layer": 1, "passed": True,
                                                       "judged_by": "tolerance"})]
    assert "No checkpoint was judged" not in tolerances_section(session, mixed)


def test_model_explorer_opens_on_the_margin_and_the_introduced_error(tmp_path):
    manifest = write_result_model_explorer(ValidationResult.from_dict(DRILL), tmp_path)
    checkpoints, layer = manifest["graphs"]
    assert checkpoints["default_overlay"] == "margin" and layer["default_overlay"] == "introduced"
    assert checkpoints["command"].endswith("checkpoints.margin.json")
    assert layer["command"].endswith("layer_1.introduced.json")
