"""User text (paths with rich markup such as ``[/]`` and ``[bold]``, ids with ``{}``) prints literally in
debug_validate, session_report and the batch progress bar, and never crashes them."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

MARKUP = "[/]x[bold]{y}"


@pytest.mark.slow  # a validation and two reports in process (~3 s, most of it first imports)
def test_markup_in_paths_prints_literally_in_debug_validate_and_session_report(tiny_llama, tmp_path, capsys,
                                                                               monkeypatch):
    from debug_framework.cli import session_report
    from debug_framework.cli.debug_validate import run

    monkeypatch.setenv("COLUMNS", "400")
    model = shutil.copytree(tiny_llama, tmp_path / f"model {MARKUP}" / "hf")
    db = tmp_path / f"db {MARKUP}" / "s.db"
    out = tmp_path / f"out {MARKUP}" / "r.json"
    cfg = tmp_path / f"cfg {MARKUP}" / "c.json"  # "/" of "[/]" makes a directory
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps({"precision_thresholds": {"post_mlp:2": {"rtol": 0, "atol": 0}}}))
    code = run(["--model-path", str(model), "--alternative-backend", "pytorch", "--database", str(db),
                "--config-file", str(cfg), "--checkpoints", "post_mlp", "--output-file", str(out),
                "--verbose"])
    text = capsys.readouterr().out
    assert code == 1 and "FAILED: first divergence at post_mlp:2" in text
    assert f"in {db}; wrote {out}" in text and out.is_file()
    sid = text.split("session ")[-1].split()[0]

    assert session_report.main(["--list", "--database", str(db)]) == 0
    listing = capsys.readouterr().out
    assert f"Sessions in {db}" in listing and str(model) in listing and sid in listing
    assert session_report.main(["--session-id", sid, "--database", str(db), "--output-format", "csv",
                                "--output-file", str(cfg.parent / "r.csv")]) == 0
    assert f"to {cfg.parent / 'r.csv'}" in capsys.readouterr().err


def test_batch_progress_bar_shows_a_job_id_literally(capsys):
    """The bar's text is the job id as given: not markup (``[/]`` crashed rich), not a format field (``{y}``)."""
    from debug_framework.services.batch_executor import BatchExecutor

    class Batches:
        def progress(self, job_id: str) -> dict[str, int]:
            return {"finished": 2}

    class Job:  # what _follow reads of a BatchValidationJob: its id, models and the batch store's progress
        job_id = f"job {MARKUP}"
        model_paths = ["a", "b"]
        db = type("Db", (), {"batches": Batches()})()

    done = threading.Event()
    done.set()
    BatchExecutor._follow(Job(), [], True, None, done)
    assert f"batch job {MARKUP}" in capsys.readouterr().out
