"""``debug_validate`` as a CI runs it: exit codes 0 / 1 / 2, JSON on stdout, output files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debug_framework.cli.debug_validate", *map(str, args)],
                          capture_output=True, text=True, timeout=240,
                          env={**ENV, "PIE_DEBUG_ARTIFACT_ROOT": os.environ.get("PIE_DEBUG_ARTIFACT_ROOT", "")})


def test_exit_0_pass_with_json_and_html(tiny_llama, any_db_path, tmp_path):
    db_path = any_db_path  # a SQLite file, then a postgresql:// URL (its files under PIE_DEBUG_ARTIFACT_ROOT)
    html = tmp_path / "out" / "report.html"
    p = _cli("--model-path", tiny_llama, "--alternative-backend", "pytorch", "--database", db_path, "--json",
             "--isolate", "--checkpoints", "post_attention,post_mlp", "--output-file", html)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "passed" and doc["first_divergence"] is None
    assert len(doc["results"]) == 12 and doc["introducing_layers"] == []
    assert html.read_text().lstrip().lower().startswith("<!doctype html")
    assert doc["session_id"] in html.read_text()
    if str(db_path).startswith("postgresql://"):  # the inputs went to the artifact root, the row to the server
        assert list((tmp_path / "artifacts").glob(f"*_inputs/{doc['session_id']}.safetensors"))
        assert "pie-test-secret" not in p.stdout + p.stderr


def test_exit_1_numerical_failure_names_first_divergence(tiny_llama, db_path, tmp_path):
    cfg = tmp_path / "session.json"
    cfg.write_text(json.dumps({"precision_thresholds": {"post_mlp:2": {"rtol": 0, "atol": 0}}}))
    out = tmp_path / "result.json"
    p = _cli("--model-path", tiny_llama, "--alternative-backend", "pytorch", "--database", db_path,
             "--config-file", cfg, "--output-file", out, "--no-isolate")
    assert p.returncode == 1, p.stderr
    assert "first divergence at post_mlp:2" in " ".join(p.stdout.split())
    assert "<first" in p.stdout  # the highlighted row of the table
    doc = json.loads(out.read_text())
    assert doc["first_divergence"]["checkpoint"] == "post_mlp" and doc["first_divergence"]["layer"] == 2


def test_exit_2_usage_and_environment_errors(tiny_llama, db_path, tmp_path, capsys):
    """The first as a CI sees it (the process's exit status), the others in this process (``run``)."""
    from debug_framework.cli.debug_validate import run

    p = _cli("--model-path", tmp_path / "nope", "--database", db_path)
    assert p.returncode == 2 and "DF004" in p.stderr
    code = run(["--model-path", str(tiny_llama), "--alternative-backend", "no_such_backend", "--database", str(db_path),
                "--json"])
    assert code == 2 and json.loads(capsys.readouterr().out)["error"]["code"] == "DF002"
    code = run(["--database", str(db_path)])  # --model-path missing
    assert code == 2 and "--model-path" in capsys.readouterr().err
    code = run(["--model-path", str(tiny_llama), "--checkpoints", "post_nothing", "--database", str(db_path),
                "--alternative-backend", "pytorch"])
    assert code == 2 and "DF005" in capsys.readouterr().err


def test_exit_3_internal_error_names_the_crash_log(tiny_llama, tmp_path, monkeypatch, capsys):
    """A bug of ours after a real validation: exit 3 (never 1), one stderr line naming the log, the
    traceback in that log (beside the database), none on stderr."""
    import debug_framework.reports as reports
    from debug_framework.cli.debug_validate import run

    def broken_render_report(*args, **kwargs):
        raise RuntimeError("renderer broke")

    monkeypatch.delenv("PIE_DEBUG_LOG_DIR", raising=False)
    monkeypatch.setattr(reports, "render_report", broken_render_report)
    db = tmp_path / "db" / "sessions.db"
    code = run(["--model-path", str(tiny_llama), "--alternative-backend", "pytorch", "--database", str(db),
                "--checkpoints", "post_mlp", "--output-file", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.strip()]
    (log,) = (tmp_path / "db" / "logs").glob("debug_validate-*.log")
    assert "internal error" in line and "RuntimeError: renderer broke" in line and str(log) in line
    assert "broken_render_report" in log.read_text()


def test_a_bug_inside_the_validation_exits_3_a_failing_backend_exits_2(tiny_llama, tmp_path, monkeypatch, capsys):
    """A bug in a stage of ours is exit 3 (not DF005 / exit 2, never 1); a backend failing mid-run is the
    backend's failure: DF005, exit 2, naming it."""
    from debug_framework.backends.pytorch import PyTorchBackend
    from debug_framework.cli.debug_validate import run
    from debug_framework.services.validation import stages

    def broken_compare_key(*args, **kwargs):
        raise ZeroDivisionError("stage arithmetic")

    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(tmp_path / "logs"))
    args = ["--model-path", str(tiny_llama), "--alternative-backend", "pytorch", "--checkpoints", "post_mlp",
            "--no-isolate"]
    with monkeypatch.context() as m:
        m.setattr(stages, "_compare_key", broken_compare_key)
        code = run([*args, "--database", str(tmp_path / "a.db")])
    err = capsys.readouterr().err
    assert code == 3 and "ZeroDivisionError: stage arithmetic" in err and "Traceback" not in err

    def broken_run(self, *a, **k):
        raise RuntimeError("device lost")

    monkeypatch.setattr(PyTorchBackend, "run", broken_run)
    code = run([*args, "--database", str(tmp_path / "b.db")])
    err = capsys.readouterr().err
    assert code == 2 and "DF005" in err and "backend 'pytorch' failed in run()" in err and "device lost" in err


def test_user_text_prints_literally(tiny_llama, tmp_path, capsys, monkeypatch):
    from debug_framework.cli.debug_validate import run

    monkeypatch.setenv("COLUMNS", "400")
    db = tmp_path / "[red]x[/red] :smile:" / "sessions.db"
    code = run(["--model-path", str(tiny_llama), "--alternative-backend", "pytorch", "--database", str(db),
                "--checkpoints", "post_mlp"])
    out = capsys.readouterr().out
    assert code == 0 and f"in {db}" in out


def test_usage_errors_exit_2_without_a_traceback(capsys):
    from debug_framework.cli.debug_validate import run

    for argv in (["--model-path"], ["--model-path", "m", "--rtol", "tight"], ["--model-path", "m", "--bogus"]):
        assert run(argv) == 2, argv
        assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow  # a whole validation through the CLI
def test_progress_goes_layer_by_layer_on_stderr_of_a_long_run_and_json_stays_clean(tiny_llama, tmp_path, capsys,
                                                                                    monkeypatch):
    """A stderr that is not a terminal gets plain progress lines once the run is long (here: at
    once), layer by layer for the forward passes and the isolation; stdout holds the JSON alone."""
    from debug_framework.cli import framework
    from debug_framework.cli.debug_validate import run

    monkeypatch.setattr(framework, "LONG_RUN_S", 0.0)
    monkeypatch.setattr(framework, "LINE_EVERY_S", 0.0)
    code = run(["--model-path", str(tiny_llama), "--alternative-backend", "pytorch", "--database",
                str(tmp_path / "db.sqlite"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["verdict"] == "passed"
    n = json.loads(out)["isolation"][-1]["layer"] + 1
    for stage in ("reference", "alternative", "calibration", "isolation"):
        assert f"{stage}: layer {n}/{n}" in err, err
    assert "store done" in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert all(x.startswith("[") and " s] " in x for x in lines), lines


def test_progress_lines_wait_for_a_long_run_and_are_spaced():
    """Nothing on a non-terminal stderr before the run is long; then at most a line per stage every
    few seconds, the last layer and each finished stage always."""
    import io

    from rich.console import Console

    from debug_framework.cli.framework import LINE_EVERY_S, LONG_RUN_S, stage_progress

    now = [0.0]
    sink = io.StringIO()
    with stage_progress(Console(file=sink, force_terminal=False), "loading", clock=lambda: now[0]) as progress:
        progress.layers("reference", 1, 4)
        progress("prepare", 2, 9)
        assert sink.getvalue() == ""  # a short run stays quiet
        now[0] = LONG_RUN_S + 1
        progress.layers("reference", 2, 4)
        progress.layers("reference", 3, 4)  # too soon after the last line
        now[0] += LINE_EVERY_S / 2
        progress.layers("reference", 4, 4)  # the last layer: always
        progress("reference", 3, 9)
    lines = sink.getvalue().splitlines()
    assert [x.split("] ", 1)[1] for x in lines] == ["reference: layer 2/4", "reference: layer 4/4",
                                                   "reference done (3/9 stages)"], lines
