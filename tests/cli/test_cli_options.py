"""``inductor-debug`` in process: minify uses the run's own recorded constraints and takes a signature and
constraints from the command line; unknown names suggest the closest; paths with markup print literally."""

from __future__ import annotations

import json
import shutil

import pytest

from .conftest import check_json, run_in_process

MARKUP = "[/]x[bold]{y}"


@pytest.mark.slow  # two minifications, each verified in a fresh process (~5 s each)
def test_minify_run_dir_uses_the_recorded_constraints_and_takes_a_signature(artifacts_root, tmp_path, capsys):
    """The run was compiled with ShapeConstraint(alignment=8) only; the mock accelerator's default
    constraints find nothing wrong in its float32 graphs, so only the run's own rules reproduce anything."""
    run = artifacts_root["root"] / artifacts_root["aot_run"]
    code, out, err = run_in_process(capsys, "--json", "minify", str(run), "--output", str(tmp_path / "a"))
    assert code == 0, (out, err)
    sig = check_json(out)["data"]["signature"]
    assert sig["constraint"] == "shape_alignment" and sig["constraints"][0]["alignment"] == 8
    assert (tmp_path / "a" / "repro.py").is_file()

    dtype_only = json.dumps([{"name": "dtype", "allowed_dtypes": ["bfloat16"]}])
    code, out, err = run_in_process(capsys, "--json", "minify", str(run), "--constraints", dtype_only,
                           "--signature", "constraint:dtype", "--output", str(tmp_path / "b"))
    assert code == 0, (out, err)
    data = check_json(out)["data"]
    assert data["signature"]["constraint"] == "dtype" and data["verified"] is True
    assert data["signature"]["constraints"] == [{"name": "dtype", "allowed_dtypes": ["bfloat16"]}]


def test_minify_option_errors_exit_2_and_suggest(artifacts_root, tmp_path, capsys):
    run = str(artifacts_root["root"] / artifacts_root["aot_run"])
    bad_file = tmp_path / "c.json"
    bad_file.write_text('{"name": "dtype"}')
    cases = [(["--signature", "constraint:shape_alignmnt"], "did you mean 'shape_alignment'?"),
             (["--signature", "acuracy"], "did you mean 'accuracy'?"),
             (["--signature", "accuracy"], "an accuracy signature needs --backend"),
             (["--backend", "inductor"], "--backend needs --signature"),
             (["--constraints", '[{"name": "dtipe"}]'], "did you mean 'dtype'?"),
             (["--constraints", str(bad_file)], "must be a JSON list of objects"),
             (["--constraints", str(tmp_path / "none.json")], "no file"),
             (["--constraints", '[{"name": "max_rank"}]'], "incomplete or invalid")]
    for extra, expected in cases:
        code, _, err = run_in_process(capsys, "minify", run, *extra)
        assert code == 2 and expected in err and "Traceback" not in err, (extra, err)


def test_unknown_names_suggest_the_closest(artifacts_root, capsys):
    root = str(artifacts_root["root"])
    aot = artifacts_root["aot_run"]
    for args, expected in ((["analyze", "--type", "guard"], "did you mean 'guards'?"),
                           (["analyze", "--demo", "--lowering", "indcutor"], "did you mean 'inductor'?"),
                           (["report", "--format", "jsno"], "did you mean 'json'?"),
                           (["analyze", "--run", aot[:-1]], f"did you mean {aot!r}?")):
        code, _, err = run_in_process(capsys, "--root", root, *args)
        assert code == 2 and expected in err, (args, err)


def test_paths_with_markup_print_literally(artifacts_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    aot = artifacts_root["aot_run"]
    weird = tmp_path / f"root {MARKUP}"
    shutil.copytree(artifacts_root["root"] / aot, weird / aot)
    code, out, err = run_in_process(capsys, "--root", str(weird), "list")
    assert code == 0 and f"runs under {weird}" in out and aot in out, err
    for kind in ("constraints", "summary", "guards", "graphs"):
        code, out, err = run_in_process(capsys, "--root", str(weird), "analyze", "--run", aot, "--type", kind)
        assert code == 0 and f"{kind} of run {aot}" in out and str(weird / aot) in out, (kind, err)
    empty = tmp_path / f"empty {MARKUP}"
    empty.mkdir(parents=True)
    code, out, _ = run_in_process(capsys, "--root", str(empty), "list")
    assert code == 0 and out.strip() == f"no runs under {empty}"


def test_session_report_unknown_format_and_status_suggest(tmp_path, capsys):
    from debug_framework.cli.session_report import main as session_report

    db = str(tmp_path / "none.db")
    assert session_report(["--session-id", "x", "--output-format", "jsno", "--database", db]) == 2
    assert "did you mean 'json'?" in capsys.readouterr().err
    assert session_report(["--list", "--status", "passd", "--database", db]) == 2
    err = capsys.readouterr().err
    assert "--status 'passd' is not a session status (did you mean 'passed'?)" in err and "created, running" in err
