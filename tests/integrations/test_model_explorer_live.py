"""The Model Explorer overlay of a live ``ValidationResult`` (a real calibrated session of the GELU
bug on a tiny BERT): the checkpoint graph's node ids are the session's checkpoints, and the failing
layer's checkpoints are the ones beyond their bounds."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from debug_framework.reports.model_explorer import CHECKPOINT_GRAPH_ID, write_result_model_explorer

SCHEMA = Path(__file__).resolve().parents[1] / "reports" / "fixtures" / "model_explorer_node_data.schema.json"
NODE_DATA_SCHEMA = json.loads(SCHEMA.read_text())


@pytest.mark.slow  # needs the tiny BERT session (seconds, shared with the plugin tests)
def test_live_result_overlay(bug_check, tmp_path):
    _model, outcome = bug_check
    result = outcome.result
    manifest = write_result_model_explorer(result, tmp_path)
    nodes = json.loads((tmp_path / "checkpoints.json").read_text())["graphs"][0]["nodes"]
    assert [n["id"] for n in nodes] == [str(o.key) for o in result.results]
    margin = json.loads((tmp_path / manifest["graphs"][0]["node_data"]["margin"]).read_text())
    jsonschema.validate(margin, NODE_DATA_SCHEMA)
    beyond = {k for k, r in margin[CHECKPOINT_GRAPH_ID]["results"].items() if r["value"] > 1}
    assert beyond == {str(o.key) for o in result.results if not o.passed} and "post_mlp:1" in beyond
    introduced = json.loads((tmp_path / "checkpoints.introduced.json").read_text())[CHECKPOINT_GRAPH_ID]["results"]
    assert [k for k, r in introduced.items() if r.get("bgColor") == "#ef9a9a"] == ["post_mlp:1"]
