"""The op sweep's progress (issue 48, item 11): samples judged per operator, a line per operator with
the time elapsed and an estimate of the time left, the sample counts in the summary and in --json."""

from __future__ import annotations

import json
import re

import pytest

from debug_framework.conformance.progress import SweepProgress, duration_text, judged, samples_text
from debug_framework.conformance.results import OpResult, SweepResult


def _clock(*ticks: float):
    it = iter(ticks)
    return lambda: next(it)


def test_eta_is_time_per_operator_run_times_operators_left():
    p = SweepProgress(clock=_clock(0.0, 30.0, 90.0, 90.0))
    skipped = OpResult("fft", "skipped", None, "no float32", {}, seconds=0.0)  # costs nothing: not counted
    assert p.line(skipped, 1, 8) == "1/8 fft: skipped, 0 samples judged; 30s elapsed"
    exp = OpResult("exp", "pass", 1.0, None, {"pass": 2, "samples": 3, "skipped": 1}, seconds=60.0)
    assert p.line(exp, 2, 8) == "2/8 exp: pass, 2 samples judged (2 pass), 1 skipped; 1m 30s elapsed, about 9m 00s left"
    assert p.eta(8, 8) == 0.0


def test_samples_text_says_failures_and_the_noise_widening():
    counts = {"pass": 20, "fail": 3, "hang": 1, "unsupported": 2, "widened_by_noise": 4}
    assert judged(counts) == 24
    assert samples_text(counts) == ("24 samples judged (20 pass, 3 fail, 1 hang), 2 unsupported; "
                                    "4 on a bound widened by measured noise")
    assert duration_text(59.6) == "1m 00s" and duration_text(3725) == "1h 02m"


def test_the_sweeps_json_carries_the_sample_counts():
    ops = [OpResult("exp", "pass", 1.0, None, {"pass": 5, "skipped": 1, "samples": 6}),
           OpResult("neg", "fail", 0.5, "r", {"pass": 1, "fail": 1, "samples": 2, "widened_by_noise": 1})]
    d = SweepResult("k", "inductor", "cpu", ["float32"], ops).to_dict()
    assert d["samples"]["judged"] == 7 and d["samples"]["samples"] == 8 and d["samples"]["fail"] == 1
    assert d["samples"]["widened_by_noise"] == 1 and d["operators"][0]["counts"]["pass"] == 5


@pytest.mark.slow
def test_a_passing_cli_sweep_prints_samples_and_an_estimate(tmp_path, capsys):
    from debug_framework.cli.debug_opsweep import main

    args = ["--compile-backend", "aot_eager", "--ops", "abs,neg,exp", "--dtypes", "float32", "--max-samples", "2",
            "--workers", "1", "--database", str(tmp_path / "s.db")]
    assert main(args) == 0
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if re.match(r"^\d/3 ", ln)]
    assert len(lines) == 3 and all("samples judged (" in ln and "elapsed" in ln for ln in lines), cap.err
    assert "left" in lines[0] and lines[-1].endswith("elapsed, done"), cap.err
    assert re.search(r"\d+ samples judged \(\d+ pass\) over 3 operators", cap.out), cap.out
    # --json on the same database resumes every operator (no second worker process to start): the
    # counts in the JSON are the ones the sweep stored
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["resumed"] == 3 and doc["samples"]["judged"] == doc["samples"]["pass"] > 0
    assert all(o["counts"]["samples"] > 0 for o in doc["operators"])
