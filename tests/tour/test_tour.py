"""The guided tour (``debug-tour`` / ``python -m debug_module.demo``): ``--quick`` end to end, the
interactive mode driven by a scripted stdin, and bad knob values (DF005, exit 2, nothing run)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from debug_module.demo import main
from debug_module.demo.knobs import TourKnobs
from debug_module.demo.runner import STEP_NAMES

#: What each step must leave behind (labels of its artifacts).
EXPECTED_ARTIFACTS = {
    "constraints": {"run", "constraint reports"},
    "capture": {"run", "guards", "fx graph", "forward graph", "backward graph"},
    "inductor": {"run", "IR pre-fusion", "IR post-fusion", "output code"},
    "kerneldiff": {"run", "KernelDiff JSON"},
    "minifier": {"run", "repro", "repro inputs", "minifier summary"},
    "benchmark": {"benchmark JSON"},
    "report": {"HTML report", "JSON twin"},
    "cli": {"model for debug_validate"},
}


def _tour(argv: list[str], monkeypatch: pytest.MonkeyPatch, stdin: str | None = None) -> int:
    monkeypatch.setenv("COLUMNS", "200")
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return main(argv)


@pytest.mark.slow
def test_quick_runs_every_step_and_its_repro_fails_as_promised(tmp_path):
    out = tmp_path / "tour"
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-m", "debug_module.demo", "--quick", "--runs", "3", "--output", str(out)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads((out / "tour.json").read_text())
    assert doc["schema"] == "debug_module.tour/1" and doc["exit_code"] == 0
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == list(STEP_NAMES)
    for name, step in steps.items():
        assert step["status"] == "ok", (name, step["lines"])
        assert EXPECTED_ARTIFACTS[name] <= set(step["artifacts"]), name
        for label, path in step["artifacts"].items():
            assert Path(path).exists(), (name, label, path)
    # real results, not placeholders: violations at the default alignment 8, a graph per AOT kind,
    # generated kernels, a passing KernelDiff, a benchmark with eager as the anchor
    assert "shape_alignment" in "\n".join(steps["constraints"]["lines"])
    assert any("backward graph" in line for line in steps["capture"]["lines"])
    assert list((Path(steps["inductor"]["artifacts"]["run"]) / "inductor_kernels").rglob("*.cpp"))
    assert "PASS" in steps["kerneldiff"]["lines"][0]
    bench = json.loads(Path(steps["benchmark"]["artifacts"]["benchmark JSON"]).read_text())
    assert [r["backend"] for r in bench["results"]] == ["eager", "inductor", "mock_backend"]
    assert "<html" in Path(steps["report"]["artifacts"]["HTML report"]).read_text().lower()
    # the repro is standalone: run where the project cannot be imported, it fails (exit 1) with the
    # forced failure's observation (the denied op)
    repro = Path(steps["minifier"]["artifacts"]["repro"])
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([sys.executable, "-I", str(repro)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=clean_env)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "DEBUG_MODULE_OBSERVATION" in r.stdout and "aten.tanh.default" in r.stdout
    # the CLI step prints the commands with the tour's real paths
    assert f"inductor-debug list --root {out / 'runs'}" in p.stdout
    assert f"python {repro}" in p.stdout


@pytest.mark.slow
def test_interactive_knob_change_reruns_the_step_with_it(tmp_path, monkeypatch, capsys):
    # start; after the constraints step ask for alignment=1 (re-run); then next step (the end)
    code = _tour(["--step", "constraints", "--output", str(tmp_path)], monkeypatch, stdin="\nalignment=1\n\n")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "knobs now: alignment=1; re-running constraints" in out
    counts = [int(line.split()[0]) for line in out.splitlines() if line.split()[1:2] == ["violation(s)"]
              or line.split()[1:2] == ["violation(s):"]]
    assert len(counts) == 2 and counts[1] < counts[0], out  # alignment 8 flags dims that alignment 1 allows
    assert json.loads((tmp_path / "tour.json").read_text())["knobs"]["alignment"] == 1


def test_interactive_bad_knob_is_explained_and_asked_again(tmp_path, monkeypatch, capsys):
    # the minifier step without a forced failure is instant (skipped); batch=0 and a misspelt knob are
    # refused with DF005 and asked again, fail_op=... re-runs the step with it, q quits
    code = _tour(["--step", "minifier", "--no-force-failure", "--output", str(tmp_path)], monkeypatch,
                 stdin="\nbatch=0\nbacth=4\nfail_op=aten.erf.default\nq\n")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[DF005]" in out and "batch=0 is out of range" in out
    assert "unknown knob 'bacth' (did you mean 'batch'?)" in out
    assert out.count("5/8 minifier") == 2 and "knobs now: fail_op=aten.erf.default; re-running minifier" in out
    doc = json.loads((tmp_path / "tour.json").read_text())
    assert doc["knobs"]["fail_op"] == "aten.erf.default" and doc["knobs"]["batch"] == 2
    assert [s["status"] for s in doc["steps"]] == ["skipped"]


@pytest.mark.slow
def test_a_step_that_raises_is_named_with_its_error_and_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "report.html").mkdir()  # the report cannot be written there: the user's environment
    code = _tour(["--quick", "--step", "report", "--output", str(tmp_path)], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("debug-tour step report: error: IsADirectoryError"), err


def test_interactive_end_of_input_quits_cleanly(tmp_path, monkeypatch, capsys):
    assert _tour(["--output", str(tmp_path)], monkeypatch, stdin="") == 0
    assert "tour summary" not in capsys.readouterr().out  # nothing ran


@pytest.mark.parametrize("argv, words", [
    (["--batch", "0"], ["[DF005]", "batch=0", "from 1 to 64"]),
    (["--padding", "8"], ["[DF005]", "padding=8", "from 0 to 7"]),
    (["--rtol", "-1"], ["[DF005]", "rtol=-1.0 is not valid"]),
    (["--runs", "many"], ["[DF005]", "runs=many is not valid"]),
    (["--fail-op", "tanh;rm"], ["[DF005]", "is not an op name"]),
    (["--step", "minify"], ["unknown step 'minify'", "did you mean 'minifier'"]),
])
def test_bad_knob_value_is_a_clear_df_error_and_exit_2(tmp_path, monkeypatch, capsys, argv, words):
    out = tmp_path / "never"
    code = _tour(["--quick", "--output", str(out), *argv], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("debug-tour: ") and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    assert not out.exists()  # refused before anything ran


@pytest.mark.slow
def test_a_failing_step_is_named_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    code = _tour(["--quick", "--step", "minifier", "--fail-op", "aten.not_in_this_model.default",
                  "--output", str(tmp_path)], monkeypatch)
    captured = capsys.readouterr()
    assert code == 1
    assert "debug-tour: step 'minifier' failed: the model does not use aten.not_in_this_model.default" in captured.err


def test_knobs_parse_and_check():
    k = TourKnobs().changed({"deny_ops": "aten.tanh.default, aten.erf.default", "force_failure": "no", "atol": "1e-3",
                             "rtol": "default"})
    assert k.deny_ops == ("aten.tanh.default", "aten.erf.default") and k.force_failure is False
    assert k.atol == 1e-3 and k.rtol is None
    assert TourKnobs().changed({"seq": "4", "padding": "3"}).padding == 3
