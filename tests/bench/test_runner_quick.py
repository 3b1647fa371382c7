"""The benchmark runner end to end on the tiny models (quick mode), plus its usage errors.

The runner measures and prints; these tests check what it wrote (structure, counts, verdicts), never a time.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import runner

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "benchmarks.runner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_list(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("bert-minilm", "bert-base", "resnet18", "ssm", "aot_mock_backend"):
        assert name in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu_is_a_usage_error(capsys, tmp_path):
    assert runner.main(["--model", "resnet", "--device", "cuda", "--output-dir", str(tmp_path)]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args", [[], ["--model", "vgg"], ["--all", "--runs", "0"]])
def test_usage_errors(args, capsys):
    assert runner.main(args) == 2
    assert "error:" in capsys.readouterr().err


def _rows(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text())
    assert data["schema"] == "debug_module.benchmark/1" and data["size"] == "tiny"
    return {r["backend"]: r for r in data["results"]}


@pytest.mark.slow
def test_quick_pipeline_two_model_families(tmp_path):
    out = tmp_path / "results"
    common = ["--quick", "--threads", "1", "--warmup", "1", "--runs", "2", "--kd-runs", "1", "--output-dir", str(out)]
    # eager and the mock backend on the tiny ResNet and SSM in one run (a BERT is benchmarked by the
    # tour's benchmark step, tests/tour; Inductor's cold and warm compiles are covered by
    # tests/backends/test_compiled.py and the tour, the AOT mock backend's by tests/module and
    # tests/minifier; here the mock backend is the compiled one)
    a = _run("--model", "resnet", "--model", "ssm", "--backend", "eager",
             "--backend", "mock_backend", *common)
    assert a.returncode == 0, a.stderr[-3000:]
    assert "BENCHMARK SUMMARY REPORT" in a.stdout

    # several models: a process each, so that memory figures are per model
    pids = {json.loads((out / f).read_text())["process"]
            for f in ("resnet18-cpu-tiny.json", "ssm-cpu-tiny.json")}
    assert len(pids) == 2 and a.stdout.count("in a process of its own") == 2

    files = {p.name for p in out.glob("*.json")}
    assert files == {"resnet18-cpu-tiny.json", "ssm-cpu-tiny.json"}
    suite = json.loads((out / "combined" / "suite.json").read_text())
    assert suite["schema"] == "debug_module.benchmark-suite/1" and len(suite["results"]) == 2

    ssm = _rows(out / "ssm-cpu-tiny.json")
    assert set(ssm) == {"eager", "mock_backend"}
    for name, row in ssm.items():
        assert "error" not in row, row.get("error")
        assert row["latency_ms"]["runs"] == 2 and row["latency_ms"]["mean"] > 0
        assert row["peak_memory_bytes"] > 0
        if name == "eager":
            continue
        assert row["compile_s"] > 0 and row["warm_compile_s"] > 0
        assert row["graph_count"] >= 1 and row["graph_breaks"] == 0
        kd = row["kerneldiff_detail"]
        assert kd["eager"]["mode"] == "tolerance" and kd["float64"]["mode"] == "float64-ratio"
        assert row["kerneldiff"] == "pass", kd
    for name in ("mock_backend",):
        c = ssm[name]["constraints"]
        assert sum(c["violations_by_kind"].values()) == ssm[name]["violations"] == c["violations"]
        assert 0 < c["coverage"]["supported_nodes"] <= c["coverage"]["nodes"]

    data = json.loads((out / "ssm-cpu-tiny.json").read_text())
    default, strict = data["constraint_profiles"]["default"], data["constraint_profiles"]["strict"]
    assert strict["violations"] > default["violations"]
    # the depthwise causal conv1d of the Mamba mixer is an aten.convolution: denylisted in the strict profile
    assert strict["violations_by_kind"]["unsupported_op"] >= 1
    assert any(s["where"].startswith("benchmarks/models/mamba.py:") for s in strict["top_sources"])

    resnet = json.loads((out / "resnet18-cpu-tiny.json").read_text())
    assert resnet["constraint_profiles"]["strict"]["violations_by_kind"]["unsupported_op"] == 20  # 20 convs

    # the debug report reads the benchmark files and the mock/KernelDiff run directories
    from debug_module.reports import build_report

    report = build_report(out / "runs", benchmarks_dir=out)
    assert len(report["benchmarks"]) == 2 and report["benchmarks_skipped"] == []
    assert report["summary"]["kerneldiff_total"] >= 4
    speedups = {r["backend"]: r["speedup_vs_eager"] for r in
                next(b for b in report["benchmarks"] if b["workload"] == "ssm")["results"]}
    assert speedups["eager"] == pytest.approx(1.0)
    assert "SSM (Mamba-style) (tiny) [mock_backend vs float64]" in report["summary"]["models"]


def test_a_model_whose_process_fails_is_a_result_saying_so(tmp_path, monkeypatch):
    import argparse
    import subprocess

    import torch

    from benchmarks import runner

    stale = tmp_path / "ssm-cpu-tiny.json"
    stale.write_text("{}")  # from an earlier run: must not pass for this one
    monkeypatch.setattr(runner.subprocess, "run", lambda cmd, cwd: subprocess.CompletedProcess(cmd, -9))
    args = argparse.Namespace(output_dir=tmp_path, kd_runs=1, device="cpu", threads=1, quick=True,
                              no_kerneldiff=True, verbose=False)
    res = runner._run_child("ssm", args, ["eager"], 0, 1, torch.device("cpu"), "tiny")
    assert res["results"] == [] and res["name"] == "ssm-cpu-tiny"
    assert res["error"] == "the benchmark process for ssm exited with code -9 without writing its result"
    assert not stale.exists()
    assert "ERROR the benchmark process for ssm" in runner.detail_table([res])
    assert "n/a" in runner.summary_table([res])
