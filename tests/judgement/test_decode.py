"""Decode steps: the prefill, then tokens decoded one at a time through each backend's own KV cache,
teacher-forced with the reference's greedy tokens; every step's checkpoints judged, the first
divergence naming its step; a bug only in the decode path is found at a step >= 1."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest

from debug_framework.errors import BackendInitializationError, ConfigurationError

from benchmarks.decode_bugs import kv_cache_in_bfloat16 as _kv_cache_in_bfloat16
from benchmarks.decode_bugs import rope_at_zero_while_decoding as _rope_at_zero_while_decoding
from benchmarks.injected_bugs import BUG_LAYER

#: the generic tier: float64_eager (the model's own code in float64) decodes through its cache
DECODE = {"model_tier": "generic", "decode_steps": 3, "isolate": False, "precision_diagnosis": False,
          "input_shape": [2, 8], "pad_lengths": [0, 3]}


@pytest.fixture
def decode_bug(patched_backend):
    """``make(patch) -> name``: a ``pytorch``-like module backend with a decode-only bug."""
    return lambda patch: patched_backend(f"decode_bug_{patch.__name__.strip('_')}", patch)


def test_a_correct_backend_passes_every_decode_step(tiny_models, engine):
    """Left-padded rows from position 5 decode at their own positions; the float64 reference stays
    finite (a fully masked padded row is no NaN: Float64Softmax)."""
    cfg = {**DECODE, "padding_side": "left", "position_offset": 5}
    result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert result.passed, result.first_divergence
    assert all(r.comparison.nan_count_ref == 0 for r in result.results)
    assert all(r.comparison.masked_positions == 3 for r in result.results if r.step == 0)
    steps = sorted({r.step for r in result.results})
    assert steps == [0, 1, 2, 3] and result.results[0].id.endswith("@0")
    assert all(r.judged_by == "calibration" for r in result.results)
    decode = result.summary()["decode"]
    assert decode["steps"] == 3 and np.asarray(decode["tokens"]).shape == (2, 3)
    assert {row["step"] for row in decode["kv_cache"]} == {0, 1, 2, 3}  # the cache after every pass, per layer
    assert all(row["passed"] and row["k"]["judged_by"] == "calibration" for row in decode["kv_cache"])


def test_one_input_row_decodes(tiny_models, engine):
    """A batch of one (no padding): the KV cache rows are judged over its positions."""
    cfg = {**DECODE, "decode_steps": 1, "input_shape": [1, 6], "pad_lengths": [0]}
    result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert result.passed, result.first_divergence
    assert {row["step"] for row in result.summary()["decode"]["kv_cache"]} == {0, 1}


@pytest.mark.parametrize("patch,where", [(_rope_at_zero_while_decoding, f"post_attention:{BUG_LAYER}"),
                                         (_kv_cache_in_bfloat16, "post_attention:0")])
def test_a_decode_only_bug_is_found_at_its_step_and_layer(tiny_models, engine, decode_bug, patch, where):
    result = engine.run(engine.create_session(tiny_models("llama", 0), DECODE, "float64_eager", decode_bug(patch)))
    assert not result.passed
    assert all(r.passed for r in result.results if r.step == 0)  # the prefill passes
    first = result.first_divergence
    assert first.step == 1 and str(first.key) == where and first.id == f"{where}@1"
    ref = result.summary()["first_divergence"]
    assert (ref["step"], ref["checkpoint"], ref["layer"]) == (1, "post_attention", first.key.layer)
    if patch is _rope_at_zero_while_decoding:  # the stored session: its reports mark the one row of that step
        from debug_framework.models.validation_report import ValidationReport
        from debug_framework.reports import render_report

        report = ValidationReport.from_session(result.session_id, engine.db)
        csv_rows = list(csv.DictReader(io.StringIO(render_report(report, "csv"))))
        assert [r["id"] for r in csv_rows if r["first_divergence"] == "1"] == [first.id]
        assert render_report(report, "junit").count("[first divergence]") == 1
        assert json.loads(render_report(report, "json"))["first_divergence"]["step"] == 1
        assert render_report(report, "html").count("&larr; first divergence") == 1
    source = result.error_source
    if patch is _kv_cache_in_bfloat16:  # the cache after the prefill already differs: it is named the source
        assert (source["kind"], source["step"], source["layer"]) == ("kv_cache", 0, 0)
        rows = [r for r in result.summary()["decode"]["kv_cache"] if r["step"] == 0]
        assert rows and not any(r["passed"] for r in rows)
    else:  # the cache the prefill wrote is right: the decode step itself goes wrong
        assert (source["kind"], source["step"], source["layer"]) == ("decode", 1, BUG_LAYER)
        assert all(r["passed"] for r in result.summary()["decode"]["kv_cache"] if r["step"] == 0)


def test_given_tokens_and_bad_decode_settings(tiny_models, engine):
    cfg = {**DECODE, "decode_steps": 2, "decode_tokens": [[1, 2], [3, 4]]}
    result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert result.passed and result.summary()["decode"]["tokens"] == [[1, 2], [3, 4]]
    for bad in ({"decode_steps": -1}, {"decode_tokens": [[1]]}):
        with pytest.raises(ConfigurationError):
            engine.create_session(tiny_models("llama", 0), {**DECODE, "decode_steps": 0, **bad}, "float64_eager",
                                  "pytorch")
    with pytest.raises(ConfigurationError, match="decode_tokens"):  # refused before anything runs
        engine.create_session(tiny_models("llama", 0), {**DECODE, "decode_tokens": [[1, 2, 3]]}, "float64_eager",
                              "pytorch")
    with pytest.raises(ConfigurationError, match="max_position_embeddings"):
        engine.create_session(tiny_models("llama", 0), {**DECODE, "decode_steps": 10_000}, "float64_eager", "pytorch")
    no_decode = engine.create_session(tiny_models("bert", 0), {**DECODE, "model_tier": "auto"}, "python_reference",
                                      "pytorch")
    with pytest.raises(BackendInitializationError, match="encoder") as refused:  # DF002: what the backend cannot do
        engine.run(no_decode)
    assert refused.value.code == "DF002"


def test_debug_validate_decode_steps_json(tiny_models, decode_bug, tmp_path, capsys):
    """``debug_validate --decode-steps N --json``: the first divergence names its step, checkpoint
    and layer (exit 1); bad decode options exit 2."""
    import json

    from debug_framework.cli.debug_validate import run

    base = ["--model-path", str(tiny_models("llama", 0)), "--reference-backend", "float64_eager",
            "--database", str(tmp_path / "d.db"), "--no-isolate"]
    code = run([*base, "--alternative-backend", decode_bug(_rope_at_zero_while_decoding), "--decode-steps", "2",
                "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["decode"]["steps"] == 2
    first = out["first_divergence"]
    assert (first["step"], first["checkpoint"], first["layer"]) == (1, "post_attention", BUG_LAYER)
    assert run([*base, "--alternative-backend", "pytorch", "--decode-steps", "2", "--decode-tokens", "1,x"]) == 2
    assert run([*base, "--alternative-backend", "pytorch", "--decode-steps", "-1"]) == 2


def _top_two_swapped_while_decoding(net: torch.nn.Module) -> None:
    """The LM head swaps each row's two best logits at a decode step (one new token per row): the
    prefill's logits and every hidden state are untouched."""

    def swap(_module, _args, out):
        if out.shape[1] != 1:
            return out
        top = out.topk(2, dim=-1)
        return out.scatter(-1, top.indices, top.values.flip(-1))

    net.lm_head.register_forward_hook(swap)


TOKEN_KEYS = {"kl_divergence", "top1_agreement", "topk_overlap", "delta_p", "logits_nmse"}


def _doc_session() -> tuple[list[str], list[str]]:
    """The decode session of docs/validation.md: its command's arguments and the lines it prints
    from the verdict on (under the checkpoint table)."""
    import re
    import shlex
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "validation.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"<!-- decode-session -->\s*```text\n(.*?)```", doc, re.S)
    command = block[:block.index("\n", block.index("--decode-steps"))]  # "$ debug_validate ... \\\n ... --decode-steps 2 ..."
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["$", "debug_validate"]
    shown = block[block.index("PASSED"):].splitlines()
    return argv[2:], shown


def test_debug_validate_token_metrics_json(tiny_models, decode_bug, tmp_path, capsys, monkeypatch):
    """The decode session of docs/validation.md prints what the page shows; with ``--json``:
    token_metrics per pass (0 the prefill) with their judgement; a correct pair passes them all, a
    bug only in the decode logits fails by the tokens at step 1."""
    import json

    from debug_framework.cli.debug_validate import run

    argv, shown = _doc_session()
    model = str(tiny_models("llama", 0))
    monkeypatch.setenv("COLUMNS", "100")
    assert run([model if a == "tiny-llama" else a for a in argv]
               + ["--database", str(tmp_path / "d.db"), "--output-file", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(printed) if line.startswith("PASSED"))
    for doc_line, line in zip(shown, printed[at:]):
        if doc_line.split() and doc_line.split()[0].isdigit():  # a grid row: its step and its columns
            assert line.split()[0] == doc_line.split()[0] and len(line.split()) == len(doc_line.split()), line
        elif doc_line.startswith("at float32 this run can see"):  # the sensitivity line: its words, not its figure
            assert re.sub(r"[0-9.e+-]+%", "X%", line.rstrip()) == re.sub(r"[0-9.e+-]+%", "X%", doc_line.rstrip())
        else:
            assert line.rstrip() == doc_line.rstrip()
    result = json.loads((tmp_path / "r.json").read_text())
    rows = result["decode"]["token_metrics"]
    from debug_framework.storage.database import open_database

    stored = open_database(tmp_path / "d.db").checkpoints.for_session(result["session_id"])
    assert [(r["id"], r["step"]) for r in stored] == [(r["id"], r["step"]) for r in result["results"]]  # every step's row
    assert [r["step"] for r in rows] == [0, 1, 2] and all(TOKEN_KEYS <= set(r) for r in rows)
    assert set(rows[0]["kl_divergence"]) == {"mean", "p99", "max"}
    assert all(r["passed"] and r["judged_by"] == "token_metrics" and r["top1_agreement"] == 1.0 for r in rows)

    base = ["--model-path", model, "--reference-backend", "float64_eager",
            "--database", str(tmp_path / "d.db"), "--no-isolate", "--decode-steps", "2", "--json"]
    assert run([*base, "--alternative-backend", decode_bug(_top_two_swapped_while_decoding)]) == 1
    out = json.loads(capsys.readouterr().out)
    first = out["first_divergence"]
    assert (first["step"], first["checkpoint"], first["judged_by"]) == (1, "post_processing", "token_metrics")
    assert "next token differs" in first["reason"]
    rows = out["decode"]["token_metrics"]
    assert rows[0]["passed"] and rows[0]["top1_agreement"] == 1.0  # the prefill's tokens agree
    assert not rows[1]["passed"] and rows[1]["top1_agreement"] == 0.0 and rows[1]["kl_divergence"]["max"] > 0
    token = out["decode"]["first_divergent_token"]
    assert token["step"] == 1 and token["index"] == [0, 0] and token["reference_gap"] > 0
    assert token["alternative_token"] != token["reference_token"]
    assert out["error_source"]["kind"] == "decode" and out["error_source"]["step"] == 1
    _the_views_show_it(out)


def _the_views_show_it(out: dict) -> None:
    """The terminal (80 columns), the HTML report and the dashboard draw the same step x layer view."""
    from debug_framework.dashboard.charts import decode_frames
    from debug_framework.reports._decode import decode_section, decode_text
    from debug_framework.services.validation.results import ValidationResult

    result = ValidationResult.from_dict(out)  # the typed result the JSON was written from
    lines = decode_text(result, 80)
    grid_lines = lines[:2 + 3]  # the legend, the header, steps 0..2 (then the token and KV-cache sentences)
    assert all(len(line) <= 80 for line in grid_lines) and lines[1].split()[:2] == ["step", "emb"]
    step1 = next(line for line in lines if line.split()[0] == "1")
    # the head fails first; the top-1 tokens failed the pass (no token agrees), marked on them, the KL
    # beside its bound; a line under the grid says which metric failed and why
    assert step1.split()[-4].endswith("<") and step1.endswith("0.00*")
    assert any(x.startswith("tokens fail at step 1 by its top-1 tokens") for x in lines)
    assert "first divergent token: decode step 1" in "\n".join(lines)
    html = decode_section(result)
    assert 'id="decode"' in html and '<td class="num first">' in html and 'id="first-divergent-token"' in html
    grid, _kv = decode_frames(result)
    assert list(grid["step"]) == [0, 1, 2] and grid.loc[1, "head"].endswith("FIRST") and grid.loc[1, "tokens"] == "FAIL"
    hostile = ValidationResult.from_dict(
        {**out, "decode": {**out["decode"], "first_divergent_token": {"step": 1, "reference_token": "<b>x</b>"}}})
    assert "<b>" not in decode_section(hostile) and "&lt;b&gt;" in decode_section(hostile)
