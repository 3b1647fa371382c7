"""Acceptance and behaviour tests of debug_module.minifier (see docs/minifier.md)."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest
import torch

import debug_module as dm
from debug_module.constraints import DtypeConstraint, MemoryConstraint, OpDenylistConstraint
from debug_module.errors import MinifierError
from debug_module.minifier import (AccuracySignature, ConstraintSignature, ExceptionSignature, Minifier,
                                   minify_saved_graph, verify_repro)
from debug_module.minifier.codegen import OBSERVATION_PREFIX
from debug_module.repro import set_repro_writer

from .conftest import log2_bound


def compute_ops(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def observation(stdout: str) -> dict:
    line = next(l for l in stdout.splitlines() if l.startswith(OBSERVATION_PREFIX))
    return json.loads(line[len(OBSERVATION_PREFIX):])


# --------------------------------------------------------------------------- acceptance


@pytest.mark.slow
def test_scaled_op_among_200_reduces_to_it_and_repro_fails_in_fresh_process(chain_graph, bb, tmp_path, run_clean):
    gm, inputs = chain_graph(200, {123: "sigmoid"})
    n = len([x for x in gm.graph.nodes if x.op == "call_function"])
    assert n >= 200
    sig = AccuracySignature(bb.sigmoid_off_by_one_percent, rtol=1e-3, atol=1e-5)
    result = Minifier(gm, inputs, sig, progress=False, output_dir=tmp_path / "repro").minify()
    assert compute_ops(result.gm) == ["aten.sigmoid.default"]
    assert result.calls <= log2_bound(n), result.calls
    assert result.verified is True and result.verification.returncode == 1
    # the repro directory, run again independently, from elsewhere, without this project
    proc = run_clean(result.repro_path)
    assert proc.returncode == 1, proc.stderr
    obs = observation(proc.stdout)
    assert sig.holds(obs) and not obs["outputs"][0]["passed"]
    files = sorted(p.name for p in (tmp_path / "repro").iterdir())
    assert files == ["backend_buggy_backends.py", "inputs.safetensors", "repro.json", "repro.py", "verify.log"]
    text = (tmp_path / "repro" / "repro.py").read_text()
    assert "torch.ops.aten.sigmoid.default(" in text and "pickle" not in text and "base64" not in text
    manifest = json.loads((tmp_path / "repro" / "repro.json").read_text())
    assert manifest["writer"] == "minifier" and manifest["environment"]["torch"] == torch.__version__
    assert manifest["check"]["nodes"] == 1 and proc.stdout.strip().splitlines()[-1].startswith("REPRO: reproduced: ")


def test_wrong_op_swapped_in_reduces_to_it(chain_graph, bb):
    gm, inputs = chain_graph(200, {57: "erf"})
    sig = AccuracySignature(bb.erf_swapped_for_tanh, rtol=1e-3, atol=1e-5)
    result = Minifier(gm, inputs, sig, progress=False, verify=False).minify()
    assert compute_ops(result.gm) == ["aten.erf.default"]
    assert result.calls <= log2_bound(len(compute_ops(gm)))
    assert sig.check(result.gm, result.inputs)[0]


def test_two_bugs_signature_naming_one_reduces_to_that_one(chain_graph, bb):
    # The compiler fails on tanh too (a RuntimeError); NotImplementedError is a RuntimeError, so an
    # oracle of "it raised a RuntimeError" could drift to the tanh bug. The signature names the erf one.
    gm, inputs = chain_graph(120, {30: "tanh", 90: "erf"})
    erf_sig = ExceptionSignature(NotImplementedError, r"aten\.erf", backend=bb.rejects_erf_and_tanh)
    r2 = Minifier(gm, inputs, erf_sig, progress=False, verify=False).minify()
    assert compute_ops(r2.gm) == ["aten.erf.default"]
    tanh_only = ExceptionSignature(RuntimeError, r"register pressure", backend=bb.rejects_erf_and_tanh)
    assert not tanh_only.check(gm, inputs)[0]  # masked by the erf error on the full graph
    # and with two accuracy bugs, an intermediate output names the one we want
    gm2, inputs2 = chain_graph(60, {10: "sigmoid", 50: "tanh"})
    sigmoid_node = next(n.name for n in gm2.graph.nodes if n.target is torch.ops.aten.sigmoid.default)
    acc = AccuracySignature(bb.sigmoid_and_tanh_off, rtol=1e-3, atol=1e-5, output=sigmoid_node)
    r3 = Minifier(gm2, inputs2, acc, progress=False, verify=False).minify()
    assert compute_ops(r3.gm) == ["aten.sigmoid.default"]


class Float64Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = h.double() * 2.0  # the accelerator has no float64
        return self.fc2(h.float()).softmax(-1)


@pytest.mark.slow
def test_strict_mode_float64_cast_writes_verified_repro_by_default(tmp_path, run_clean):
    backend = dm.aot_mock_backend(strict=True, constraints=[DtypeConstraint()], artifact_root=tmp_path / "art")
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(Float64Model(), backend=backend)(torch.randn(4, 16))
    err = dm.constraint_error(info.value)
    assert err is not None and err.repro_path is not None
    repro = Path(err.repro_path)
    assert repro.parent.parent.name == "repros" and repro.parent.parent.parent == backend.run_dir
    first = err.violations[0]
    summary = json.loads((repro.parent / "minify.json").read_text())
    assert summary["verified"] is True and summary["nodes"] == 1
    proc = run_clean(repro)
    assert proc.returncode == 1, proc.stderr
    obs = observation(proc.stdout)
    assert any(v["constraint"] == "dtype" and v["op"] == first.op for v in obs["violations"])
    manifest = json.loads((backend.run_dir / "manifest.json").read_text())
    assert {f"repros/{repro.parent.name}/repro.py", f"repros/{repro.parent.name}/inputs.safetensors"} <= {
        f["path"] for f in manifest["files"] if f["kind"] == "repro"}


class PeakModel(torch.nn.Module):
    """Large intermediates alive together: the peak is several times the input."""

    def forward(self, x):
        a = x * 2.0
        b = a + 1.0
        c = torch.cat([a, b, x])
        return c.exp().sum(0)


@pytest.mark.slow
def test_strict_mode_peak_memory_writes_verified_repro(tmp_path, run_clean):
    """memory_peak is a whole-graph limit; its repro re-estimates the peak by the same liveness walk
    (the repro runtime's), on the graph traced from the repro itself."""
    x = torch.randn(256, 512)
    limit = 4 * x.nbytes
    backend = dm.aot_mock_backend(strict=True, constraints=[MemoryConstraint(max_peak_bytes=limit)],
                                  artifact_root=tmp_path / "art")
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(PeakModel(), backend=backend)(x)
    err = dm.constraint_error(info.value)
    assert err is not None and [v.constraint for v in err.violations] == ["memory_peak"]
    assert err.repro_path is not None
    repro = Path(err.repro_path)
    assert json.loads((repro.parent / "minify.json").read_text())["verified"] is True
    proc = run_clean(repro)
    assert proc.returncode == 1, proc.stderr
    [v] = [v for v in observation(proc.stdout)["violations"] if v["constraint"] == "memory_peak"]
    assert v["op"] == err.violations[0].op and int(v["message"].split()[4]) > limit


def test_strict_writer_can_be_turned_off(tmp_path):
    previous = set_repro_writer(None)
    try:
        backend = dm.aot_mock_backend(strict=True, constraints=[DtypeConstraint()], artifact_root=tmp_path)
        with pytest.raises(Exception) as info, torch.no_grad():
            torch.compile(Float64Model(), backend=backend)(torch.randn(4, 16))
    finally:
        set_repro_writer(previous)
    assert dm.constraint_error(info.value).repro_path is None
    assert not any((backend.run_dir / "repros").iterdir())


def test_never_an_empty_graph(chain_graph, bb):
    gm, inputs = chain_graph(40, {})
    always = ExceptionSignature(RuntimeError, "always", backend=bb.always_fails)
    result = Minifier(gm, inputs, always, progress=False, verify=False).minify()
    assert result.nodes == 1 and len(compute_ops(result.gm)) == 1
    with pytest.raises(MinifierError, match="does not hold on the input graph"):
        Minifier(gm, inputs, ExceptionSignature(RuntimeError, "x", backend=bb.rejects_erf_and_tanh),
                 progress=False, verify=False).minify()


# --------------------------------------------------------------------------- constraints


def test_constraint_signature_two_violations_naming_one(chain_graph):
    gm, inputs = chain_graph(50, {10: "erf", 40: "double"})
    cons = [DtypeConstraint(), OpDenylistConstraint(["aten.erf"])]
    sig_dtype = ConstraintSignature("dtype", "aten._to_copy.default", constraints=cons)
    sig_op = ConstraintSignature("unsupported_op", "aten.erf", constraints=cons)
    r1 = Minifier(gm, inputs, sig_dtype, progress=False, verify=False).minify()
    r2 = Minifier(gm, inputs, sig_op, progress=False, verify=False).minify()
    assert compute_ops(r1.gm) == ["aten._to_copy.default"]
    assert compute_ops(r2.gm) == ["aten.erf.default"]


def test_parameters_kept_only_where_used():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Parameter(torch.randn(8, 8))
            self.w2 = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.mm(torch.erf(torch.mm(x, self.w1)), self.w2)

    gm = torch.fx.symbolic_trace(Net())
    sig = ConstraintSignature("unsupported_op", "aten.erf", constraints=[OpDenylistConstraint(["aten.erf"])])
    result = Minifier(gm, [torch.randn(4, 8)], sig, progress=False, verify=False).minify()
    assert [n.op for n in result.gm.graph.nodes if n.op == "get_attr"] == []
    assert len(result.inputs) == 1 and result.inputs[0].shape == (4, 8)
    sig_mm = ConstraintSignature("shape_alignment", constraints=[dm_shape(16)])
    r2 = Minifier(gm, [torch.randn(4, 8)], sig_mm, progress=False, verify=False).minify()
    assert r2.nodes == 1


def dm_shape(a):
    from debug_module.constraints import ShapeConstraint

    return ShapeConstraint(alignment=a)


# --------------------------------------------------------------------------- control: budget, cache, resume


def test_budget_stops_with_a_failing_graph(chain_graph, bb):
    gm, inputs = chain_graph(100, {70: "sigmoid"})
    sig = AccuracySignature(bb.sigmoid_off_by_one_percent, rtol=1e-3, atol=1e-5)
    result = Minifier(gm, inputs, sig, progress=False, verify=False, max_calls=5).minify()
    assert result.stopped and "budget" in result.stopped and result.calls == 5
    assert 1 <= result.nodes < 100 and sig.check(result.gm, result.inputs)[0]


def test_resume_from_state_file_and_cache(chain_graph, bb, tmp_path):
    gm, inputs = chain_graph(100, {70: "sigmoid", 20: "tanh"})
    sig = AccuracySignature(bb.sigmoid_and_tanh_off, rtol=1e-3, atol=1e-5)
    state = tmp_path / "state.json"
    full = Minifier(gm, inputs, sig, progress=False, verify=False).minify()
    first = Minifier(gm, inputs, sig, progress=False, verify=False, max_calls=6, state_path=state).minify()
    assert first.stopped and state.exists()
    resumed = Minifier(gm, inputs, sig, progress=False, verify=False, state_path=state).minify()
    assert resumed.stopped is None
    assert sorted(compute_ops(resumed.gm)) == sorted(compute_ops(full.gm))
    assert resumed.calls == full.calls  # the 6 saved verdicts were not re-run: 6 + the rest
    assert resumed.cache_hits >= 6
    other = AccuracySignature(bb.sigmoid_and_tanh_off, rtol=1e-2, atol=1e-5)
    with pytest.raises(MinifierError, match="another graph or signature"):
        Minifier(gm, inputs, other, progress=False, verify=False, state_path=state).minify()


@pytest.mark.slow
def test_isolated_parallel_oracle_survives_a_crashing_backend(chain_graph, bb, tmp_path):
    gm, inputs = chain_graph(8, {5: "erf"})
    sig = ExceptionSignature("ProcessCrash", r"signal 6", backend=bb.crashes_on_erf)
    result = Minifier(gm, inputs, sig, progress=False, isolate=True, jobs=2, verify=True,
                      output_dir=tmp_path / "r").minify()
    assert compute_ops(result.gm) == ["aten.erf.default"]
    assert result.verified is True


# --------------------------------------------------------------------------- repro files, saved graphs


def test_repro_keeps_non_contiguous_inputs_and_float64_reference(bb, tmp_path, run_clean):
    def f(x):
        return torch.sigmoid(x.t() * 2.0) + 1.0

    x = torch.randn(16, 8)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(x)
    sig = AccuracySignature(bb.sigmoid_off_by_one_percent, reference="float64", rtol=1e-3, atol=1e-5)
    result = Minifier(gm, [x], sig, progress=False, verify=False).minify()
    assert "aten.sigmoid.default" in compute_ops(result.gm)
    repro = result.write_repro(tmp_path / "r")
    res = verify_repro(repro, sig)
    assert res.reproduced, res.stderr


@pytest.mark.slow
def test_minify_saved_graph_from_run_directory_and_repro_dir(tmp_path):
    backend = dm.aot_mock_backend(strict=False, constraints=[DtypeConstraint()], artifact_root=tmp_path / "art")
    with torch.no_grad():
        torch.compile(Float64Model(), backend=backend)(torch.randn(4, 16))
    graph_file = next((backend.run_dir / "aot_graphs").glob("*.py"))
    result = minify_saved_graph(graph_file, progress=False)
    assert result.verified is True and result.nodes == 1
    assert result.repro_path.parent == backend.run_dir / "repros" / graph_file.stem
    again = minify_saved_graph(result.repro_path.parent, progress=False, verify=False)
    assert again.nodes == 1 and again.signature.to_dict()["constraint"] == "dtype"


def test_unreferenceable_backend_keeps_the_reduction_and_says_why(chain_graph, bb):
    gm, inputs = chain_graph(30, {20: "sigmoid"})
    inner = bb.sigmoid_off_by_one_percent
    sig = AccuracySignature(lambda g, i: inner(g, i), rtol=1e-3, atol=1e-5)  # a lambda: no module-level name
    result = Minifier(gm, inputs, sig, progress=False).minify()
    assert compute_ops(result.gm) == ["aten.sigmoid.default"]
    assert result.verified is False and result.repro_path is None
    assert any("backend_spec" in n for n in result.notes)


def test_ratio_rule_signature_minifies_and_its_repro_agrees(bb, tmp_path, run_clean):
    """KernelDiff's float64 judgement in the minifier: the same RatioRule.verdict in process, and the
    repro's standalone copy (_runtime.ratio_outputs) decides the same."""
    from debug_framework.comparison import RatioRule, compare
    from debug_module.minifier import _runtime

    def f(x):
        return torch.sigmoid(x.t() * 2.0) + torch.cos(x.t())

    x = torch.randn(16, 8)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(x)
    rule = RatioRule(2.0, 1e-5, "rmse")
    sig = AccuracySignature(bb.sigmoid_off_by_one_percent, reference="float64", ratio=rule)
    assert sig.to_dict()["ratio"] == {"multiplier": 2.0, "floor": 1e-5, "metric": "rmse"}
    result = Minifier(gm, [x], sig, progress=False, verify=False).minify()
    assert compute_ops(result.gm) == ["aten.sigmoid.default"]  # the cos branch is not the bug
    res = verify_repro(result.write_repro(tmp_path / "r"), sig)
    assert res.reproduced, res.stderr
    proc = run_clean(tmp_path / "r" / "repro.py")
    assert proc.returncode == 1 and "REPRO: reproduced: " in proc.stdout, proc.stdout + proc.stderr
    # a correct backend passes the rule (the eager graph's own float32 error is allowed, times 2)
    ok = AccuracySignature(lambda g, i: g, reference="float64", ratio=rule)
    assert not ok.check(gm, [x])[0]
    # the standalone copy and the project's verdict agree, NaN and infinities included
    gen = torch.Generator().manual_seed(0)
    oracle = torch.randn(257, dtype=torch.float64, generator=gen)
    for scale, poison in ((1e-7, None), (1e-3, None), (1e-7, float("nan")), (0.0, float("inf"))):
        base = (oracle + 1e-7 * torch.randn(257, dtype=torch.float64, generator=gen)).float()
        alt = (oracle + scale * torch.randn(257, dtype=torch.float64, generator=gen)).float()
        if poison is not None:
            alt[3] = poison
        (row,) = _runtime.ratio_outputs(oracle, base, alt, 2.0, 1e-5)
        v = rule.verdict(compare(oracle, base, equal_nan=True, check_dtype=False),
                         compare(oracle, alt, equal_nan=True, check_dtype=False))
        assert row["passed"] == v.passed, (scale, poison, row, v)
        if row["test_error"] is not None:
            assert abs(row["test_error"] - v.judgement.alternative_error) <= 1e-12 * max(1.0, row["test_error"])


def test_ratio_signature_needs_float64_and_rmse(bb):
    from debug_framework.comparison import RatioRule

    with pytest.raises(MinifierError, match="ratio-rule"):
        AccuracySignature(bb.sigmoid_off_by_one_percent, ratio=RatioRule())
    with pytest.raises(MinifierError, match="ratio-rule"):
        AccuracySignature(bb.sigmoid_off_by_one_percent, reference="float64", ratio=RatioRule(metric="max_abs_error"))
