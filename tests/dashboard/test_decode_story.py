"""One result, one story: for a bug that only shows at decode step 1 (layer 1's attention rotates a
decoded token at position 0), the terminal, the JSON, the HTML report's summary box and isolation
section and the dashboard name the same step, layer and block, and none of them says "none"
beside it."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest

from .conftest import run_page

pytest.importorskip("streamlit")

ROOT = Path(__file__).resolve().parents[2]
STORY = "layer 1 (attention) at decode step 1"


@pytest.fixture(scope="module")
def decode_bug_session(tmp_path_factory):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.decode_bugs import register_decode_bug
    from benchmarks.models.tiny_transformers import make_model
    from debug_framework.backends import unregister_backend

    tmp = tmp_path_factory.mktemp("decode_story")
    model = make_model("llama", tmp / "llama", 0)
    name = register_decode_bug("rope_wrong_position")
    yield model, name, tmp
    unregister_backend(name)


def _validate(model, backend, database, *extra):
    from debug_framework.cli.debug_validate import run

    return run(["--model-path", str(model), "--alternative-backend", backend, "--decode-steps", "3",
                "--database", str(database), *extra])


def test_every_view_names_the_same_step_layer_and_block(decode_bug_session, capsys, monkeypatch):
    model, backend, tmp = decode_bug_session
    database = tmp / "story.db"
    report = tmp / "story.html"
    monkeypatch.setenv("COLUMNS", "200")
    assert _validate(model, backend, database, "--output-file", str(report)) == 1
    terminal = capsys.readouterr().out
    assert f"source: {STORY}" in terminal
    assert f"isolation: error introduced by {STORY}" in terminal and "no layer introduces" not in terminal

    assert _validate(model, backend, database, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    source = doc["error_source"]
    assert (source["kind"], source["step"], source["layer"], source["block"]) == ("decode", 1, 1, "attention")

    page = html.unescape(re.sub(r"<[^>]+>", "", report.read_text()))
    assert f"layers that introduce error (isolation): {STORY}" in page  # the summary box
    assert f"source of the error: {STORY}" in page
    assert f"Layers that introduce error on their own: {STORY}" in page  # the isolation section
    assert "introduce error (isolation): none" not in page

    from debug_framework.dashboard.settings import ARTIFACTS_VARIABLE, DATABASE_VARIABLE

    monkeypatch.setenv(DATABASE_VARIABLE, str(database))
    monkeypatch.setenv(ARTIFACTS_VARIABLE, str(tmp / "artifacts"))
    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(tmp / "logs"))
    at = run_page("session.py", {"id": doc["session_id"]})
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["introducing layers"].replace("\\", "") == STORY  # shown as literal text (markdown escaped)
    assert STORY in "\n".join(t.value for t in at.text)


def test_the_stored_result_tells_the_same_story(decode_bug_session, capsys):
    """What every view renders is the typed result read back from the store: its error source, its
    introducing layers and its first divergence name the same step, layer and block as the run did."""
    from debug_framework.reports._common import error_source_text, introducing_text
    from debug_framework.services.validation.results import ValidationResult

    model, backend, tmp = decode_bug_session
    database = tmp / "typed.db"
    assert _validate(model, backend, database, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    loaded = ValidationResult.load(database, doc["session_id"])
    assert loaded.source is not None and error_source_text(loaded.source) == STORY
    assert introducing_text(loaded.introducing()) == STORY
    assert loaded.first_divergence is not None and loaded.first_divergence.step == 1
    assert loaded.first_divergence.id == doc["first_divergence"]["id"]
    assert loaded.to_dict()["results"] == doc["results"]  # every row reads back as the run wrote it
