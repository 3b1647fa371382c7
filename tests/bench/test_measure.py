"""debug_framework.measure: run statistics, device sync, timers, peak memory, per-layer time, timed backends."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import pytest
import torch

from debug_framework import measure
from debug_framework.measure import LayerTiming, PeakMemory, TimedBackend, Timer, layer_timer, run_stats, synchronize


def test_run_stats_values_and_units():
    s = run_stats([0.001, 0.003, 0.002])
    assert s["mean"] == pytest.approx(0.002) and s["median"] == 0.002
    assert s["min"] == 0.001 and s["max"] == 0.003 and s["samples"] == 3
    assert s["std"] == pytest.approx(statistics.stdev([0.001, 0.003, 0.002]))
    ms = run_stats([0.001, 0.003, 0.002], unit="ms", count_key="runs")
    assert ms["mean"] == pytest.approx(2.0) and ms["max"] == pytest.approx(3.0) and ms["runs"] == 3
    assert "samples" not in ms


def test_run_stats_one_and_no_sample():
    assert run_stats([0.5])["std"] is None and run_stats([0.5])["median"] == 0.5
    empty = run_stats([], unit="ms", count_key="runs")
    assert empty == {"mean": None, "std": None, "median": None, "min": None, "max": None, "runs": 0}


def test_synchronize_is_a_noop_on_cpu(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("CUDA must not be touched for a CPU device")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    for dev in (None, "cpu", torch.device("cpu"), "mps"):
        synchronize(dev)
    with Timer("cpu") as t:
        time.sleep(0.01)
    assert 0.009 <= t.seconds < 1.0


def test_synchronize_waits_on_cuda_devices(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(device))
    synchronize("cuda:1")
    synchronize(torch.device("cuda"))
    assert seen == ["cuda:1", torch.device("cuda")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc")
@pytest.mark.parametrize("method", ["auto", "rss_sampled_2ms"])
def test_peak_memory_sees_a_big_allocation(method):
    mem = PeakMemory("cpu")
    if method != "auto":
        mem.method = method
    size = 256 << 20
    with mem:
        block = np.ones(size, dtype=np.uint8)  # touched: resident
        time.sleep(0.02)
        del block
    r = mem.result
    assert r.method in ("rss_vmhwm", "rss_sampled_2ms")
    assert r.delta_bytes is not None and r.delta_bytes >= size * 0.9
    d = r.to_dict()
    assert d["peak_bytes"] - d["baseline_bytes"] == d["delta_bytes"] and d["method"] == r.method


def test_peak_memory_is_reusable_and_small_blocks_stay_small():
    mem = PeakMemory()
    for _ in range(2):
        with mem:
            pass
        assert mem.result.method == mem.method
    if mem.result.delta_bytes is not None:
        assert mem.result.delta_bytes < 64 << 20


def test_peak_memory_unmeasurable_says_so(monkeypatch):
    monkeypatch.setattr(measure, "_cpu_method", lambda: None)
    with PeakMemory() as mem:
        pass
    assert mem.result.peak_bytes is None and mem.result.delta_bytes is None
    assert "not measurable" in mem.result.to_dict()["note"]


def test_timed_backend_counts_calls_and_keeps_graphs_on_request():
    def inner(gm, example_inputs):
        time.sleep(0.005)
        return gm.forward

    counting = TimedBackend(inner)
    keeping = TimedBackend(inner, keep_graphs=True)
    for backend in (counting, keeping):
        f = torch.compile(lambda x: torch.relu(x) + 1, backend=backend)
        f(torch.randn(3))
        f(torch.randn(5, 2))  # new rank: another graph
    assert counting.calls == 2 and counting.graphs == [] and counting.compile_s >= 0.01
    assert keeping.calls == 2 and len(keeping.graphs) == 2
    gm, inputs = keeping.graphs[0]
    assert isinstance(gm, torch.fx.GraphModule) and isinstance(inputs, list)


class _Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Model:
    num_layers = 3


class _TorchBackend:
    def __init__(self) -> None:
        self.module = _Layers()
        self.layer_modules = {i: f"layers.{i}" for i in range(3)}
        self.model = _Model()
        self.device = "cpu"


def test_layer_timer_times_each_layer_by_hooks_and_removes_them():
    backend = _TorchBackend()
    with layer_timer(backend) as timing:
        backend.module(torch.randn(2, 4))
    assert timing.method == "forward hooks on the layer modules"
    assert timing.per_layer_s is not None and len(timing.per_layer_s) == 3 and all(t > 0 for t in timing.per_layer_s)
    assert not backend.module.layers[0]._forward_hooks and not backend.module.layers[0]._forward_pre_hooks


def test_layer_timer_wraps_the_reference_layer_function_and_restores_it():
    class Reference:
        def layer(self, i, h):
            return h + i

    ref = Reference()
    backend = type("B", (), {"reference": ref, "model": _Model()})()
    with layer_timer(backend) as timing:
        for i in range(3):
            ref.layer(i, 0)
    assert timing.method == "timing of the reference's per-layer function" and len(timing.per_layer_s) == 3
    assert "layer" not in vars(ref)


def test_layer_timer_partial_or_disabled():
    backend = _TorchBackend()
    with layer_timer(backend) as timing:
        backend.module.layers[0](torch.randn(2, 4))  # one layer of three: not one by one
    assert timing.per_layer_s is None and timing.method is None and "not measurable" in timing.note
    with layer_timer(backend, enabled=False) as off:
        backend.module(torch.randn(2, 4))
    assert off == LayerTiming()


def test_measure_imports_neither_torch_nor_other_project_modules():
    import subprocess

    code = ("import sys; import debug_framework; before = set(sys.modules); import debug_framework.measure as m; "
            "m.synchronize('cpu'); m.run_stats([1.0]); "
            "print(sorted(k for k in set(sys.modules) - before if k == 'torch' or k.startswith('torch.') "
            "or (k.startswith('debug_framework.') and k != 'debug_framework.measure')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
