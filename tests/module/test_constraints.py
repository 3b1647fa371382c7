"""Constraint checking on ATen graphs via the eager-validation mock backend (no Inductor: fast)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn as nn

import debug_module as dm
from debug_framework.errors import BackendInitializationError, ValidationError
from debug_framework._torch import check_torch_version
from debug_module.config import read_mock_env
from debug_module.constraints import (
    CallableConstraint,
    DtypeConstraint,
    DynamicShapeConstraint,
    LayoutConstraint,
    MaxRankConstraint,
    MemoryConstraint,
    OpDenylistConstraint,
    ShapeConstraint,
    estimate_peak_memory,
)
from debug_module.errors import ConstraintViolationError, UnsupportedTorchVersionError
from debug_module.repro import set_repro_writer


def compile_and_run(model, *inputs, backend, **kw):
    return torch.compile(model, backend=backend, **kw)(*inputs)


def expect_violation_error(model, *inputs, backend, **kw) -> ConstraintViolationError:
    with pytest.raises(Exception) as info:
        compile_and_run(model, *inputs, backend=backend, **kw)
    err = dm.constraint_error(info.value)
    assert err is not None, f"no ConstraintViolationError in {info.value!r}"
    return err


class Float64Proj(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        return self.proj(x).double() * 2  # DOUBLE-LINE


class AlignedProj(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        return self.proj(x) * 2


# ----------------------------------------------------------------------------- acceptance


def test_conv_denylisted_in_strict_mode_lists_node_and_source_line(conv_net):
    backend = dm.make_mock_backend(strict=True, constraints=[OpDenylistConstraint(["aten.convolution.default"])])
    err = expect_violation_error(conv_net, torch.randn(2, 3, 8, 8), backend=backend)
    assert isinstance(err, ValidationError) and err.code == "DM002"
    [v] = err.violations
    assert v.op == "aten.convolution.default" and v.node == "convolution"
    assert v.shape == [2, 8, 8, 8] and v.dtype == "float32"
    assert v.source is not None and v.source.file.endswith("conftest.py")
    assert "CONV-LINE" in v.source.code or "self.conv(x)" in v.source.code
    assert "aten.convolution.default" in str(err) and f"conftest.py:{v.source.line}" in str(err)


@pytest.mark.parametrize(("entry", "torch_level"), [
    ("aten.convolution", False), ("torch.nn.Conv2d", True), (torch.nn.Conv2d, True),
    (torch.ops.aten.convolution.default, False)])
def test_denylist_matches_packets_torch_level_names_and_objects(conv_net, entry, torch_level):
    backend = dm.make_mock_backend(strict=False, constraints=[OpDenylistConstraint([entry])])
    compile_and_run(conv_net, torch.randn(1, 3, 8, 8), backend=backend)
    # a torch-level entry also covers the gradient of that call (its backward nodes record it)
    gradient = ["aten.convolution_backward.default"] if torch_level else []
    assert [v.op for v in backend.violations] == ["aten.convolution.default", *gradient]


class GeluHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)).sum()


@pytest.mark.parametrize("entry", ["torch.nn.functional.gelu", torch.nn.functional.gelu])
def test_torch_level_denylist_covers_the_backward_of_that_call(entry):
    """Backward nodes carry the forward call they differentiate (fwd_source_fn_stack): denying gelu
    denies gelu's gradient too, and nothing of the Linear's."""
    backend = dm.aot_mock_backend(strict=False, constraints=[OpDenylistConstraint([entry])])
    torch.compile(GeluHead(), backend=backend)(torch.randn(4, 8)).backward()
    backward = {v.op for v in backend.violations if v.graph.endswith("backward")}
    forward = {v.op for v in backend.violations if v.graph.endswith("forward")}
    assert "aten.erf.default" in forward
    assert "aten.exp.default" in backward  # d/dx gelu = Phi(x) + x * exp(-x^2/2) / sqrt(2 pi)
    assert not backward & {"aten.mm.default", "aten.sum.dim_IntList"}  # the Linear's gradient is allowed


def test_float64_cast_caught_and_aligned_shapes_pass():
    cons = [ShapeConstraint(alignment=16), DtypeConstraint({"float32", "float16"})]
    err = expect_violation_error(Float64Proj(), torch.randn(32, 64),
                                 backend=dm.make_mock_backend(strict=True, constraints=cons))
    f64 = [v for v in err.violations if v.constraint == "dtype"]
    assert f64 and all(v.dtype == "float64" for v in f64)
    assert any("DOUBLE-LINE" in (v.source.code if v.source else "") or ".double()" in (v.source.code if v.source else "")
               for v in f64)
    assert not [v for v in err.violations if v.constraint == "shape_alignment"]

    model = AlignedProj()
    x = torch.randn(32, 64)
    backend = dm.make_mock_backend(strict=True, constraints=cons)
    with torch.no_grad():  # inference graph (training adds a [1, 64] bias-grad sum, rightly misaligned)
        out = compile_and_run(model, x, backend=backend)
        torch.testing.assert_close(out, model(x))
    assert backend.reports and all(r.ok for r in backend.reports)


def test_every_violation_is_reported_not_just_the_first():
    cons = [ShapeConstraint(alignment=16), DtypeConstraint({"float32"})]
    err = expect_violation_error(Float64Proj(), torch.randn(30, 64), backend=dm.make_mock_backend(strict=True, constraints=cons))
    kinds = {v.constraint for v in err.violations}
    assert kinds == {"dtype", "shape_alignment"}
    assert len(err.violations) >= 4
    assert f"{len(err.violations)} violation(s)" in str(err)
    json.dumps(err.to_dict())  # serialisable


def test_warn_mode_logs_records_and_runs(caplog):
    backend = dm.make_mock_backend(strict=False, constraints=[DtypeConstraint({"float32"})])
    model, x = Float64Proj(), torch.randn(8, 64)
    with caplog.at_level(logging.WARNING, logger="debug_module.constraints"):
        out = compile_and_run(model, x, backend=backend)
    torch.testing.assert_close(out, model(x))
    assert backend.violations and all(v.dtype == "float64" for v in backend.violations)
    assert any("constraint violation" in r.getMessage() for r in caplog.records)


def test_explicit_empty_constraint_list_means_no_constraints():
    backend = dm.make_mock_backend(strict=True, constraints=[])
    compile_and_run(Float64Proj(), torch.randn(3, 64), backend=backend)
    assert backend.reports and not backend.violations


def test_default_mock_constraints_reject_float64_by_default():
    err = expect_violation_error(Float64Proj(), torch.randn(3, 64), backend=dm.make_mock_backend())
    assert {v.constraint for v in err.violations} == {"dtype"}


# ----------------------------------------------------------------------------- env + named backend


def test_mock_env_is_read_with_documented_defaults(monkeypatch):
    cfg = read_mock_env({})
    assert (cfg.strict, cfg.alignment, cfg.max_memory) == (True, 1, 17179869184)
    cfg = read_mock_env({"MOCK_STRICT": "0", "MOCK_ALIGNMENT": "8", "MOCK_MAX_MEMORY": "1024"})
    assert (cfg.strict, cfg.alignment, cfg.max_memory) == (False, 8, 1024)
    with pytest.raises(BackendInitializationError):
        read_mock_env({"MOCK_ALIGNMENT": "eight"})
    with pytest.raises(BackendInitializationError):
        read_mock_env({"MOCK_STRICT": "maybe"})


def test_named_mock_accel_backend_follows_env(monkeypatch):
    from debug_module.backend.mock import mock_backend

    mock_backend.clear()
    monkeypatch.setenv("MOCK_ALIGNMENT", "8")
    err = expect_violation_error(AlignedProj(), torch.randn(6, 64), backend="mock_accel")
    assert {v.constraint for v in err.violations} == {"shape_alignment"}

    dm.constraint_error  # noqa: B018
    monkeypatch.setenv("MOCK_STRICT", "0")
    import debug_framework._torch.dynamo as dyn

    dyn.reset()
    mock_backend.clear()
    model, x = AlignedProj(), torch.randn(6, 64)
    torch.testing.assert_close(compile_and_run(model, x, backend="mock_accel"), model(x))
    assert mock_backend.violations and all(v.constraint == "shape_alignment" for v in mock_backend.violations)


def test_mock_max_memory_limits_each_tensor(monkeypatch):
    monkeypatch.setenv("MOCK_MAX_MEMORY", str(64 * 64 * 4 - 1))
    err = expect_violation_error(AlignedProj(), torch.randn(64, 64), backend=dm.mock_backend)
    assert {v.constraint for v in err.violations} == {"memory_per_tensor"}
    assert all(v.actual >= 64 * 64 * 4 and v.limit == 64 * 64 * 4 - 1 for v in err.violations)


# ----------------------------------------------------------------------------- individual constraints


def test_shape_alignment_dims_modes():
    x = torch.randn(6, 64)
    for dims, bad in (("all", True), ("last", False), ((0,), True), ((-1,), False)):
        backend = dm.make_mock_backend(strict=False, constraints=[ShapeConstraint(16, dims=dims)])
        with torch.no_grad():
            compile_and_run(AlignedProj(), x, backend=backend)
        assert bool(backend.violations) is bad, dims
        import debug_framework._torch.dynamo as dyn

        dyn.reset()


def test_layout_contiguity_views_and_channels_last():
    class T(nn.Module):
        def forward(self, x):
            y = x.t()             # a view: non-contiguous but allocates nothing
            return y.clone() + 1  # clone keeps the transposed strides: a materialised non-contiguous tensor

    b = dm.make_mock_backend(strict=False, constraints=[LayoutConstraint()])
    compile_and_run(T(), torch.randn(4, 8), backend=b)
    assert {v.op for v in b.violations} <= {"aten.clone.default", "aten.add.Tensor"} and b.violations
    import debug_framework._torch.dynamo as dyn

    dyn.reset()
    b2 = dm.make_mock_backend(strict=False, constraints=[LayoutConstraint(check_views=True)])
    compile_and_run(T(), torch.randn(4, 8), backend=b2)
    assert "aten.permute.default" in {v.op for v in b2.violations} or "aten.t.default" in {v.op for v in b2.violations}

    class CL(nn.Module):
        def forward(self, x):
            return x * 2

    xcl = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    for allow, expect in ((True, False), (False, True)):
        dyn.reset()
        b3 = dm.make_mock_backend(strict=False, constraints=[LayoutConstraint(allow_channels_last=allow)])
        compile_and_run(CL(), xcl, backend=b3)
        assert bool(b3.violations) is expect


def test_max_rank_and_callable_constraints():
    class R(nn.Module):
        def forward(self, x):
            return x.unsqueeze(0).unsqueeze(0) * 3

    seen = []

    def no_mul(info):
        seen.append(info.op)
        return "multiplication is emulated in software" if info.op == "aten.mul.Tensor" else None

    b = dm.make_mock_backend(strict=False, constraints=[MaxRankConstraint(3), CallableConstraint(no_mul)])
    compile_and_run(R(), torch.randn(2, 2, 2), backend=b)
    by = {}
    for v in b.violations:
        by.setdefault(v.constraint, []).append(v)
    assert any(v.actual == 5 for v in by["max_rank"])
    assert [v.op for v in by["no_mul"]] == ["aten.mul.Tensor"]
    assert "aten.unsqueeze.default" in seen


def test_dynamic_shapes_and_symbolic_alignment():
    class D(nn.Module):
        def forward(self, x):
            return torch.cat([x, x]) * 2

    b = dm.make_mock_backend(strict=False, constraints=[DynamicShapeConstraint(allow_dynamic=False)])
    compile_and_run(D(), torch.randn(8, 4), backend=b, dynamic=True)
    assert b.violations and all(any(isinstance(d, str) for d in v.shape) for v in b.violations)

    import debug_framework._torch.dynamo as dyn

    # The raw input dim s0 cannot be proven a multiple of 2; cat's 2*s0 can.
    dyn.reset()
    two = dm.make_mock_backend(strict=False, constraints=[ShapeConstraint(2, dims=(0,))])
    compile_and_run(D(), torch.randn(8, 4), backend=two, dynamic=True)
    firsts = [v.shape[0] for v in two.violations]
    assert any(isinstance(d, str) and "*" not in d for d in firsts)
    assert not any(isinstance(d, str) and d.startswith("2*") for d in firsts)
    dyn.reset()
    eight = dm.make_mock_backend(strict=False, constraints=[ShapeConstraint(8, dims=(0,))])
    compile_and_run(D(), torch.randn(8, 4), backend=eight, dynamic=True)
    assert any(isinstance(d, str) and d.startswith("2*") for d in (v.shape[0] for v in eight.violations))

    # Last dim is symbolic (hint 8): unprovable for alignment 8, but fine by its hint.
    dyn.reset()
    prove = dm.make_mock_backend(strict=False, constraints=[ShapeConstraint(8, dims="last")])
    compile_and_run(D(), torch.randn(4, 8), backend=prove, dynamic=True)
    assert prove.violations and all(isinstance(v.shape[-1], str) for v in prove.violations)
    dyn.reset()
    hint = dm.make_mock_backend(strict=False, constraints=[ShapeConstraint(8, dims="last", symbolic="hint")])
    compile_and_run(D(), torch.randn(4, 8), backend=hint, dynamic=True)
    assert not hint.violations


# ----------------------------------------------------------------------------- memory


class Chain(nn.Module):
    """A chain of large intermediates; ``del`` makes eager lifetimes match the graph's."""

    def forward(self, x):
        a = x * 2
        b = a.exp()
        c = a + b
        del a, b
        d = torch.cat([c, c])
        del c
        e = d.sin()
        del d
        return e.sum()


def test_peak_memory_estimate_within_10_percent_of_true_live_peak(live_peak_mode):
    x = torch.randn(512, 1024)  # 2 MiB
    with live_peak_mode([x]) as oracle:
        Chain()(x)
    true_peak = oracle.peak

    backend = dm.make_mock_backend(strict=False, constraints=[])
    compile_and_run(Chain(), x, backend=backend)
    [graph] = [g for g in backend.pipelines[0].graphs if g.kind != "fx"]
    est = estimate_peak_memory(graph.graph_module)
    assert true_peak >= 4 * x.nbytes  # really a chain of large intermediates
    assert abs(est.peak_bytes - true_peak) <= 0.10 * true_peak, (est.peak_bytes, true_peak)
    assert graph.statistics["memory"]["peak_bytes"] == est.peak_bytes


def test_peak_memory_limit_violation_names_peak_node():
    x = torch.randn(512, 1024)
    b = dm.make_mock_backend(strict=False, constraints=[MemoryConstraint(max_peak_bytes=3 * x.nbytes)])
    compile_and_run(Chain(), x, backend=b)
    [v] = b.violations
    assert v.constraint == "memory_peak" and v.actual > 3 * x.nbytes and v.node is not None


def test_parameters_counted_once_in_peak():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(256, 256))

        def forward(self, x):
            return (x @ self.w) @ self.w

    b = dm.make_mock_backend(strict=False, constraints=[])
    with torch.no_grad():
        compile_and_run(Shared(), torch.randn(4, 256), backend=b)
    g = [g for g in b.pipelines[0].graphs if g.kind != "fx"][0]
    mem = g.statistics["memory"]
    assert mem["input_bytes"] == 256 * 256 * 4 + 4 * 256 * 4


# ----------------------------------------------------------------------------- coverage, records, hooks


def test_coverage_counts_fallback_ops_and_partitions(mlp):
    b = dm.make_mock_backend(strict=False, constraints=[OpDenylistConstraint(["aten.relu.default"])])
    with torch.no_grad():
        compile_and_run(mlp, torch.randn(4, 16), backend=b)
    [report] = b.reports
    cov = report.coverage
    assert cov.fallback_ops == {"aten.relu.default": 1}
    assert cov.supported_nodes == cov.nodes - 1 and 0 < cov.node_share < 1
    assert cov.partitions == 2  # relu splits fc1 from fc2
    assert "aten.relu.default" in report.summary()
    json.loads(json.dumps(report.to_dict()))


def test_strict_mode_calls_installed_repro_writer(conv_net, tmp_path):
    calls = []

    def writer(req):
        calls.append(req)
        path = tmp_path / "repro.py"
        path.write_text(f"# {len(req.violations)} violations\n{req.fx_graph.code}")
        return path

    previous = set_repro_writer(writer)
    try:
        backend = dm.make_mock_backend(strict=True, constraints=[OpDenylistConstraint(["aten.convolution"])])
        err = expect_violation_error(conv_net, torch.randn(1, 3, 8, 8), backend=backend)
    finally:
        set_repro_writer(previous)
    assert len(calls) == 1 and calls[0].graph_name == "graph_000_forward"
    assert any(n.op == "call_module" or "conv" in n.name for n in calls[0].fx_graph.graph.nodes)
    assert err.repro_path == str(tmp_path / "repro.py")


def test_torch_version_check():
    assert check_torch_version("2.13.0") == (2, 13)
    assert check_torch_version("2.13.5+cpu") == (2, 13)
    for bad in ("2.12.1", "2.14.0", "3.0.0"):
        with pytest.raises(UnsupportedTorchVersionError) as info:
            check_torch_version(bad)
        assert info.value.code == "DF002" and bad in str(info.value)
