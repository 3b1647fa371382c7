"""The op-by-op sweep: OpInfo and fuzzed samples against a float64 reference, the worst sample with
a standalone repro, crashes and hangs recorded in a worker process while the sweep goes on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from debug_framework.plugins.manifest import load_manifest
from debug_framework.plugins.samples import make_samples

from .conftest import EXAMPLES, write_plugin


@pytest.mark.slow  # imports torch's OpInfo database
def test_samples_cover_opinfo_shapes_strides_special_values_and_model_shapes():
    defn = load_manifest(EXAMPLES / "cpp")
    gelu = make_samples(defn.kernel("gelu"))
    sources = {s.source for s in gelu}
    assert sources == {"opinfo", "shape", "stride", "special", "magnitude"}
    assert {s.dtype for s in gelu} == {"float32", "float64"}
    assert any(s.kwargs.get("approximate") == "tanh" for s in gelu if s.source == "opinfo")
    rms = make_samples(defn.kernel("rms_norm"), model_shapes=[{"x": [2, 16, 64], "w": [64]}])
    layouts = {s.label: s for s in rms if s.source == "stride" and s.dtype == "float32"}
    assert not layouts["noncontiguous"].args[0].is_contiguous()
    assert layouts["broadcast"].args[0].stride()[0] == 0
    assert layouts["offset"].args[0].storage_offset() == 3
    assert any(s.args[0].numel() == 0 for s in rms if s.source == "shape")  # empty tensors are fuzzed too
    special = {s.label: s for s in rms if s.source == "special" and s.dtype == "float32"}
    assert torch.isnan(special["nan in x"].args[0]).any() and torch.isinf(special["inf in x"].args[0]).any()
    sub = special["subnormal in x"].args[0]
    assert ((sub != 0) & (sub.abs() < torch.finfo(torch.float32).tiny)).all()
    model = [s for s in rms if s.source == "model"]
    assert [tuple(s.args[0].shape) for s in model] == [(2, 16, 64)] * 2  # one per dtype
    again = make_samples(defn.kernel("rms_norm"), model_shapes=[{"x": [2, 16, 64], "w": [64]}])
    assert all(torch.allclose(a.args[0], b.args[0], rtol=0, atol=0, equal_nan=True) for a, b in zip(rms, again))  # seeded


@pytest.mark.slow
def test_the_cpp_example_passes_every_sample(cpp_sweep):
    assert cpp_sweep.passed
    gelu, rms = cpp_sweep.kernels["gelu"], cpp_sweep.kernels["rms_norm"]
    assert gelu.passed and rms.passed and gelu.pass_rate == rms.pass_rate == 1.0
    assert gelu.by_source()["opinfo"]["samples"] >= 8
    assert len(rms.samples) >= 30 and rms.count("crash") == rms.count("hang") == 0
    assert cpp_sweep.to_dict()["kernels"]["gelu"]["worst"]["result"]["status"] == "pass"


@pytest.mark.slow
def test_the_wrong_rms_norm_is_caught_with_its_worst_sample_and_a_repro(buggy_sweep):
    ks = buggy_sweep.kernels["rms_norm"]
    assert not buggy_sweep.passed and not ks.passed and 0 < ks.pass_rate < 1
    worst = ks.worst
    # eps outside the square root matters where mean(x^2) is small against eps: the smallest values
    assert worst["result"]["status"] == "fail" and worst["label"] in ("subnormal in x", "values x 0.0001")
    small = next(s for s in ks.samples if s["label"] == "values x 0.0001")
    assert small["result"]["status"] == "fail"
    assert "exceeds" in worst["result"]["reason"]
    assert worst["result"]["kernel_error"] > 5 * worst["result"]["bound"]
    assert ks.repro_verified and buggy_sweep.to_dict()["kernels"]["rms_norm"]["repro_verified"]
    run = subprocess.run([sys.executable, ks.repro], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and run.stdout.strip().splitlines()[-1].startswith("REPRO: reproduced: kernel rms_norm"), \
        run.stdout + run.stderr
    meta = json.loads((__import__("pathlib").Path(ks.repro).parent / "repro.json").read_text())
    assert meta["writer"] == "plugin-sweep" and meta["check"]["sample"]["label"] == worst["label"]


CRASHY = '''
import os, time

def ident(x):
    if x.shape[-1] == 7:
        os.abort()          # a kernel that kills its process
    if x.shape[-1] == 33:
        time.sleep(600)     # a kernel that never returns
    return x.clone()
'''


@pytest.mark.slow
def test_crashing_and_hanging_kernels_are_recorded_and_the_sweep_goes_on(tmp_path):
    from debug_framework.plugins.sweep import sweep_plugin
    from debug_framework.services.compilation_engine import CompilationEngine

    manifest = write_plugin(tmp_path / "crashy", json.dumps({
        "id": "crashy", "version": "1", "backend": "triton", "sources": ["k.py"],
        "kernels": [{"name": "ident", "op": "dfcrashy::ident(Tensor x) -> Tensor", "entry": "ident",
                     "reference": "ref.py:ident", "inputs": {"x": "...,D"}}]}),
        {"k.py": CRASHY, "ref.py": "def ident(x):\n    return x.clone()\n"})
    defn = load_manifest(manifest)
    build = CompilationEngine(tmp_path / "cache").build(defn)
    report = sweep_plugin(defn, build.artifact, timeout_s=8)  # 3 s made slow samples hangs on a busy machine
    ks = report.kernels["ident"]
    by_status = {s["result"]["status"]: s for s in ks.samples}
    assert ks.count("crash") == 1 and ks.count("hang") == 1 and report.worker_restarts == 2
    assert by_status["crash"]["args"][0]["shape"][-1] == 7 and "SIGABRT" in by_status["crash"]["result"]["reason"]
    assert by_status["hang"]["args"][0]["shape"][-1] == 33
    assert ks.count("pass") == len(ks.samples) - 2  # every other sample still ran
    assert ks.worst["result"]["status"] in ("crash", "hang") and not ks.passed


@pytest.mark.slow
def test_a_triton_repro_runs_alone_on_a_machine_without_a_gpu(tmp_path):
    """The repro sets up what the sweep did (Triton's interpreter without a GPU) and judges the same way."""
    import os

    from debug_framework.plugins.repro import write_repro_dir
    from debug_framework.services.compilation_engine import CompilationEngine

    defn = load_manifest(EXAMPLES / "triton")
    build = CompilationEngine(tmp_path / "cache").build(defn)
    spec = defn.kernels[0]
    path = write_repro_dir(defn, build.artifact, spec, next(iter(make_samples(spec))), tmp_path / "out")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1].startswith("REPRO: fixed: "), \
        run.stdout + run.stderr
