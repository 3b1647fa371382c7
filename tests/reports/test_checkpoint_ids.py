"""One name per checkpoint (issue 25): ``post_attention:1`` is spelled the same in every output of a
stored session (JSON, CSV, JUnit, HTML, the session list, the diff, Model Explorer), and no output
uses another spelling (``post_attention[1]``, ``attn1``)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import xml.etree.ElementTree as ET

import pytest

from debug_framework.checkpoint_ids import checkpoint_id, row_checkpoint_id
from debug_framework.cli.session_report import main
from debug_framework.models.validation_report import ValidationReport
from debug_framework.reports import render_diff, render_report
from debug_framework.reports._common import row_id
from debug_framework.reports.model_explorer import write_session_model_explorer
from debug_framework.services.session_diff import diff_sessions

#: any other spelling of a checkpoint: bracketed layers, the old chart aliases
OTHER_SPELLINGS = re.compile(r"post_(?:embedding|attention|mlp|processing)\[|\b(?:attn|mlp)\d+\b|>(?:emb|out)<")


def test_the_id_is_the_checkpoint_keys_spelling():
    from debug_framework.capture.keys import CheckpointKey, all_checkpoints

    for key in all_checkpoints(3):
        assert checkpoint_id(key.name, key.layer) == str(key)
        assert CheckpointKey.parse(checkpoint_id(key.name, key.layer)) == key
    assert checkpoint_id("post_attention", 1) == "post_attention:1" and checkpoint_id("post_embedding") == "post_embedding"


def test_a_stored_id_wins_and_older_rows_get_theirs_from_checkpoint_and_layer():
    assert row_checkpoint_id({"id": "post_mlp:4", "checkpoint": "post_mlp", "layer": 4}) == "post_mlp:4"
    # an older session's row: no id, or the store's integer row number, or a layer stored as text
    assert row_checkpoint_id({"checkpoint": "post_attention", "layer": 1}) == "post_attention:1"
    assert row_checkpoint_id({"id": 17, "checkpoint": "post_attention", "layer": "1"}) == "post_attention:1"
    assert row_checkpoint_id({"id": "", "checkpoint": "post_processing", "layer": None}) == "post_processing"
    assert row_id(("post_mlp", 2)) == "post_mlp:2" and row_id({"checkpoint": "post_embedding"}) == "post_embedding"


def _outputs(db, sid: str, capsys) -> dict[str, str]:
    dbp = str(db.database_path)
    out = {}
    for fmt in ("json", "csv", "junit", "html"):
        assert main(["--session-id", sid, "--database", dbp, "--output-format", fmt]) == 0
        out[fmt] = capsys.readouterr().out
    assert main(["--list", "--database", dbp]) == 0
    out["list"] = capsys.readouterr().out
    assert main(["--list", "--json", "--database", dbp]) == 0
    out["list --json"] = capsys.readouterr().out
    return out


def test_post_attention_1_is_spelled_the_same_in_every_format(db, build, tmp_path, capsys):
    # a bug in layer 0's MLP: post_mlp:0 is the first divergence, post_attention:1 fails after it
    good = build(db, bug_layer=None, n_layers=3)
    b = build(db, bug_layer=0, n_layers=3)
    failing = {(r["checkpoint"], r["layer"]) for r in b.results if not r["passed"]}
    assert b.first == ("post_mlp", 0) and ("post_attention", 1) in failing
    out = _outputs(db, b.session_id, capsys)

    doc = json.loads(out["json"])
    by_id = {r["id"]: r for r in doc["checkpoint_results"]}
    assert (by_id["post_attention:1"]["checkpoint"], by_id["post_attention:1"]["layer"]) == ("post_attention", 1)
    assert by_id["post_attention:1"]["passed"] is False and by_id["post_embedding"]["layer"] is None
    assert doc["first_divergence"] == {"id": "post_mlp:0", "checkpoint": "post_mlp", "layer": 0}

    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(out["csv"]))}
    assert (rows["post_attention:1"]["checkpoint"], rows["post_attention:1"]["layer"]) == ("post_attention", "1")
    assert rows["post_attention:1"]["passed"] == "0" and rows["post_mlp:0"]["first_divergence"] == "1"

    suite = ET.fromstring(out["junit"]).find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["post_attention:1"].find("failure") is not None
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["first_divergence"] == "post_mlp:0"

    page = out["html"]
    assert re.search(r'<td class="num">\d+</td><td>post_attention:1</td>', page)  # the checkpoint table
    assert 'class="xt" text-anchor="end"' in page and ">post_attention:1</text>" in page  # the curves' axis
    assert "first divergence: <strong>post_mlp:0 (" in page

    listed = {it["session_id"]: it for it in json.loads(out["list --json"])}
    assert listed[b.session_id]["first_divergence"]["id"] == "post_mlp:0"
    assert "post_mlp:0" in out["list"]

    diff = diff_sessions(good.session_id, b.session_id, db)
    out["diff json"] = render_diff(diff, "json")
    out["diff csv"] = render_diff(diff, "csv")
    out["diff html"] = render_diff(diff, "html", db=db)
    assert main(["--diff", good.session_id, b.session_id, "--database", str(db.database_path)]) == 1
    out["diff table"] = capsys.readouterr().out
    changes = {c["id"]: c for c in json.loads(out["diff json"])["changes"]}
    assert changes["post_attention:1"]["change"] == "worse"
    assert "post_attention:1,post_attention,1,worse" in out["diff csv"]
    assert "<td>post_attention:1</td>" in out["diff html"] and "post_attention:1" in out["diff table"]

    manifest = write_session_model_explorer(ValidationReport.from_session(b.session_id, db), tmp_path / "me")
    assert "post_attention:1" in manifest["checkpoints"]
    out["model explorer"] = (tmp_path / "me" / "checkpoints.json").read_text()

    for name, text in out.items():
        if name not in ("list", "list --json"):
            assert "post_attention:1" in text, name
        assert not OTHER_SPELLINGS.search(text), (name, OTHER_SPELLINGS.search(text))


@pytest.mark.parametrize("n_layers", [2, 12])
def test_chart_axis_labels_are_whole_ids_with_room_for_them(n_layers):
    from debug_framework.reports._html import _XT_ANGLE, _XT_CHAR_PX, line_chart

    labels = ["post_embedding", *(f"{cp}:{i}" for i in range(n_layers) for cp in ("post_attention", "post_mlp")),
              "post_processing"]
    svg = line_chart("err", labels, [("e", [1e-3] * len(labels), "#000")], log=True)
    height = float(re.search(r'height="(\d+)"', svg).group(1))
    ticks = re.findall(r'<text x="([\d.]+)" y="([\d.]+)" class="xt"[^>]*>([^<]*)</text>', svg)
    assert ticks[0][2] == "post_embedding" and {t for _x, _y, t in ticks} <= set(labels)
    assert len(ticks) == {2: 6, 12: 13}[n_layers]  # every label of 6; every 2nd of 26 (at most 14)
    cos, sin = math.cos(math.radians(_XT_ANGLE)), math.sin(math.radians(_XT_ANGLE))
    for x, y, text in ticks:  # each label ends at its tick and runs down-left, inside the picture
        run = len(text) * _XT_CHAR_PX
        assert float(x) - run * cos >= 0 and float(y) + run * sin + 3 <= height, text
    assert not OTHER_SPELLINGS.search(svg)
    # a strange stored name is cut on the axis: it cannot stretch the chart
    long = line_chart("err", ["x" * 200, "y"], [("e", [1e-3, 1e-3], "#000")], log=True)
    cut = line_chart("err", ["x" * 24, "y"], [("e", [1e-3, 1e-3], "#000")], log=True)
    assert re.search(r'height="(\d+)"', long).group(1) == re.search(r'height="(\d+)"', cut).group(1)
    assert "x" * 23 + "\u2026</text>" in long
