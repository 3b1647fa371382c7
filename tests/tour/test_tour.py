"""The guided tour (``debug-tour`` / ``python -m debug_module.demo``): the interactive mode driven by a
scripted stdin, bad knob values (DF005, exit 2, nothing run), failing and raising steps. ``--quick``
end to end is test_docs_tour.py (docs/tour.md's example)."""

from __future__ import annotations

import io
import json
import os
import signal
import sys

import pytest

from debug_module.demo import main
from debug_module.demo.knobs import TourKnobs

def _tour(argv: list[str], monkeypatch: pytest.MonkeyPatch, stdin: str | None = None) -> int:
    monkeypatch.setenv("COLUMNS", "200")
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return main(argv)


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
                 stdin="\nbatch=0\nbacth=4\nrtol=0\nfail_op=aten.erf.default\nq\n")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[DF005]" in out and "batch=0 is out of range" in out
    assert "unknown knob 'bacth' (did you mean 'batch'?)" in out
    assert "Validation failed to execute" not in out and "Invalid option or input" in out  # a typo, not a run
    assert "knobs now: rtol=0; minifier does not use them, the steps that do will" in out  # no re-run for it
    assert out.count("5/8 minifier") == 2 and "knobs now: fail_op=aten.erf.default; re-running minifier" in out
    doc = json.loads((tmp_path / "tour.json").read_text())
    assert doc["knobs"]["fail_op"] == "aten.erf.default" and doc["knobs"]["batch"] == 2 and doc["knobs"]["rtol"] == 0
    assert [s["status"] for s in doc["steps"]] == ["skipped"]


class _CtrlCAfter(io.StringIO):
    """stdin that answers its lines and then gets Ctrl-C at the next prompt."""

    def readline(self, *args: object) -> str:
        line = super().readline()
        if not line:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the signal, as the terminal sends it
        return line


def test_ctrl_c_at_a_prompt_exits_130_and_keeps_the_steps_done(tmp_path, monkeypatch, capsys, ctrl_c_raises):
    monkeypatch.setattr(sys, "stdin", _CtrlCAfter("\n"))
    code = main(["--step", "minifier", "--no-force-failure", "--output", str(tmp_path)])
    assert code == 130
    assert "debug-tour: interrupted by the user (Ctrl-C)" in capsys.readouterr().err
    doc = json.loads((tmp_path / "tour.json").read_text())
    assert doc["exit_code"] == 130 and [s["name"] for s in doc["steps"]] == ["minifier"]


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
