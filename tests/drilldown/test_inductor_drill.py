"""The Inductor drill-down strategy (debug_module.drilldown), driven directly with DrillRequests, and
the entry-point group that registers it with debug_framework.

Acceptance: Inductor with one operator miscompiled (a post-grad pass computing ``aten.erf`` 1% too
large: GELU's kernel) -> the minifier names ``aten.gelu.default`` with its module path and writes a
repro verified in a fresh process; the correct Inductor -> no culprit (one compile, no minifying).
"""

from __future__ import annotations

import math
import os
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from debug_framework.errors import ValidationError  # noqa: E402
from debug_framework.services.drilldown.entry_points import ENTRY_POINT_GROUP, entry_point_strategies  # noqa: E402
from debug_framework.services.drilldown.types import DrillRequest  # noqa: E402
from debug_module.drilldown import InductorDrillStrategy  # noqa: E402

LAYER = 1  # conftest's bert_layer fixture gives the reference's input to this layer (DRILLED_LAYER)


def _buggy_compiler(name: str = "inductor_erf_off") -> str:
    """A compiler of buggy_inductor.py as a session names it (``alternative_options``): the backend
    loads the file; the minifier copies it next to the repro, which imports it from there."""
    return f"{Path(__file__).with_name('buggy_inductor.py')}:{name}"


def _drill(bert_layer, tmp_path, compiler):
    from debug_framework.backends import get_backend

    model, inputs, hidden = bert_layer
    backend = get_backend("inductor", compiler=compiler)
    backend.prepare(model, "float32", "cpu")
    request = DrillRequest(layer=LAYER, checkpoint=f"post_mlp:{LAYER}", backend=backend, model=model, inputs=inputs,
                           hidden_in=hidden, dtype="float32", device="cpu", out_dir=tmp_path / "drill")
    return InductorDrillStrategy().drill(request)


@pytest.mark.slow
def test_a_miscompiled_operator_is_named_with_a_verified_repro(bert_layer, tmp_path):
    import torch

    drill = _drill(bert_layer, tmp_path, _buggy_compiler())
    culprit = drill.culprit
    assert culprit is not None and drill.method == "minifier"
    assert culprit.op == "aten.gelu.default"
    assert culprit.module_path == f"encoder.layer.{LAYER}.intermediate.intermediate_act_fn"
    assert culprit.source.startswith("activations.py:")
    assert [r.node for r in drill.introducing] == [culprit.node]
    others = [r for r in drill.operators if r.node != culprit.node]
    assert len(others) > 20 and all(math.isnan(r.introduced) for r in others)  # inside fused kernels: unobserved
    # the rows' node ids are the saved layer graph's FX node names (Model Explorer opens the .pt2)
    program = torch.export.load(drill.graph_file)
    assert {r.node for r in drill.operators} <= {n.name for n in program.graph_module.graph.nodes}
    # the minifier ran the repro once in a fresh process (verified): it runs alone, with the compiler
    # copied beside it, and fails while the bug is there; tensors are safetensors, never pickles
    assert culprit.verified
    repro = Path(culprit.repro_dir)
    assert {"repro.py", "backend_buggy_inductor.py", "inputs.safetensors"} <= {p.name for p in repro.iterdir()}
    assert not list(repro.glob("*.pkl")) and not list(repro.glob("*.pt"))


@pytest.mark.slow
def test_the_correct_inductor_has_no_culprit(bert_layer, tmp_path):
    drill = _drill(bert_layer, tmp_path, "inductor")
    assert drill.culprit is None and not drill.introducing
    assert "passes the float64 ratio rule" in drill.note
    assert not (tmp_path / "drill" / "repro").exists()  # nothing to minify
    assert {r.op for r in drill.operators} >= {"aten.gelu.default", "aten.layer_norm.default", "aten.softmax.int"}


@pytest.mark.slow
def test_a_compiler_that_fails_on_the_layer_is_a_note_not_a_finding(bert_layer, tmp_path):
    drill = _drill(bert_layer, tmp_path, _buggy_compiler("refuses_gelu"))
    assert drill.culprit is None and not drill.introducing
    assert "failed under refuses_gelu (not a numerical finding)" in drill.note and "no lowering" in drill.note
    assert drill.operators and drill.graph_file  # the layer was captured; only compiling it failed


def test_applies_only_to_a_prepared_inductor_backend():
    from debug_framework.backends import get_backend

    strategy = InductorDrillStrategy()
    assert strategy.applies(get_backend("pytorch"))[0] is False
    ok, why = strategy.applies(get_backend("inductor"))
    assert not ok and "not prepared" in why
    request = DrillRequest(layer=0, checkpoint="post_mlp:0", backend=get_backend("pytorch"), model=None, inputs=None,
                           hidden_in=np.zeros((1, 2, 4)), dtype="float32", device="cpu", out_dir=Path("unused"))
    with pytest.raises(ValidationError, match="not Inductor"):
        strategy.drill(request)


def test_pyproject_registers_the_inductor_strategy_in_the_entry_point_group():
    import importlib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    module, _, attr = table["inductor"].partition(":")
    assert getattr(importlib.import_module(module), attr) is InductorDrillStrategy


def test_entry_point_strategies_loads_installed_ones_and_reports_broken_ones(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "df_fake_drill-1.0.dist-info").mkdir(parents=True)
    (site / "df_fake_drill-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: df-fake-drill\nVersion: 1.0\n")
    (site / "df_fake_drill-1.0.dist-info" / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ngood = df_fake_drill:Good\nbroken = df_fake_drill:Broken\n"
        "missing = df_fake_drill_nowhere:Nothing\nnot_one = df_fake_drill:NotAStrategy\n")
    (site / "df_fake_drill.py").write_text(
        "class Good:\n    name = 'good'\n    def applies(self, backend):\n        return True, ''\n"
        "    def drill(self, request):\n        raise NotImplementedError\n"
        "class Broken:\n    def __init__(self):\n        raise RuntimeError('no accelerator here')\n"
        "class NotAStrategy:\n    pass\n")
    monkeypatch.syspath_prepend(str(site))
    strategies, failures = entry_point_strategies()
    assert [s.name for s in strategies if type(s).__module__ == "df_fake_drill"] == ["good"]
    reasons = {f.name: f.reason for f in failures}
    assert "no accelerator here" in reasons["broken"] and "ModuleNotFoundError" in reasons["missing"]
    assert "applies() and drill()" in reasons["not_one"] and "not loaded" in str(failures[0])


def test_the_docs_example_lists_the_installed_strategies(capsys):
    import re

    doc = ROOT / "docs" / "drilldown_strategies.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(doc), "exec"), {})
    names, failures = capsys.readouterr().out.strip().rsplit("] [", 1)
    assert names.startswith("[") and failures == "]"  # nothing declared fails to load


def test_the_captured_graph_runs_in_float64_where_the_model_pins_its_own_dtype():
    """RMSNorm's ``.to(float32)`` and attention's ``softmax(dtype=float32)`` are no-ops in a float32
    run; left in, they would pin the float64 reference to float32 (or break its matmuls)."""
    import torch

    from debug_module.drilldown import strip_dtype_pins

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            h = x.to(torch.float32) @ self.w
            return torch.softmax(h, dim=-1, dtype=torch.float32).to(x.dtype) @ self.w

    x = torch.randn(2, 4)
    gm = torch.export.export(Block(), (x,)).run_decompositions({}).graph_module
    stripped = strip_dtype_pins(gm)
    targets = {str(n.target) for n in stripped.graph.nodes}
    assert "aten._to_copy.default" not in targets and not any("_assert" in t for t in targets)
    w = next(iter(Block().parameters())).detach()
    (out,) = stripped(w.double(), x.double())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.softmax(x.double() @ w.double(), -1) @ w.double())
    (same,) = stripped(w, x)
    torch.testing.assert_close(same, gm(w, x)[0])


def _add_noise(gm, inputs):
    """A "compiler" whose every output is 1e-4 relative off (the same relative error at every scale)."""
    def run(*args):
        return tuple(o * (1 + 1e-4) for o in gm(*args))
    return run


def _two_scales(x):
    return x * 1e4, x + 0.0


def test_the_signature_floor_is_per_output_rms_and_the_repro_copy_agrees():
    import torch

    from debug_framework.comparison import RatioRule, finite_rms
    from debug_module.minifier import AccuracySignature, _runtime
    from debug_module.minifier.signatures import signature_from_dict

    gm = torch.fx.symbolic_trace(_two_scales)
    x = torch.randn(64, generator=torch.Generator().manual_seed(1))
    # floor 1e-3 x RMS(output): the 1e-4 relative error passes at both scales (one absolute floor could not)
    sig = AccuracySignature(_add_noise, reference="float64", ratio=RatioRule(2.0, 0.0), floor_rms=1e-3)
    holds, observed = sig.check(gm, [x])
    assert not holds, observed
    refs = gm(x.double())
    for row, ref in zip(observed["outputs"], refs, strict=True):
        assert row["bound"] == pytest.approx(2.0 * row["eager_error"] + 1e-3 * finite_rms(ref), rel=1e-9)
    assert observed["outputs"][0]["bound"] > 1e3 * observed["outputs"][1]["bound"]
    tight = AccuracySignature(_add_noise, reference="float64", ratio=RatioRule(2.0, 0.0), floor_rms=1e-6)
    assert tight.check(gm, [x])[0]
    # the JSON form keeps it; the repro's standalone copy decides the same, with the same bounds
    again = signature_from_dict(tight.to_dict(), backend=_add_noise)
    assert again.floor_rms == 1e-6 and again.to_dict() == tight.to_dict()
    with torch.no_grad():
        rows = _runtime.ratio_outputs(refs, gm(x), _add_noise(gm, [x])(x), 2.0, 0.0, 1e-6)
    for mine, theirs in zip(rows, tight.observe(gm, [x])["outputs"], strict=True):
        assert mine["passed"] == theirs["passed"] and mine["bound"] == pytest.approx(theirs["bound"], rel=1e-9)


def test_the_layer_signature_and_the_culprit_row_keep_a_measured_zero():
    from debug_framework.backends import get_backend
    from debug_module.drilldown import _worst_failure, layer_signature

    backend = get_backend("inductor")
    backend.dtype = "float32"
    request = DrillRequest(layer=0, checkpoint="post_mlp:0", backend=backend, model=None, inputs=None,
                           hidden_in=np.full((1, 2, 4), 1e6), dtype="float32", device="cpu", out_dir=Path("unused"),
                           noise_margin=3.0, floor_eps=8.0)
    sig = layer_signature(backend, request)
    assert sig.ratio.multiplier == 3.0 and sig.ratio.floor == 0.0  # no floor from the layer input's scale
    assert sig.floor_rms == pytest.approx(8.0 * np.finfo(np.float32).eps)
    assert _worst_failure({"outputs": [{"passed": False, "test_error": 0.0, "bound": 0.0}]}) == (0.0, 0.0)
    rows = [{"passed": True, "test_error": 9.0, "bound": 1.0}, {"passed": False, "test_error": 2.0, "bound": 1.0},
            {"passed": False, "test_error": 3.0, "bound": 0.5}]
    assert _worst_failure({"outputs": rows}) == (3.0, 0.5)
    assert all(math.isnan(v) for v in _worst_failure({"outputs": [{"passed": False, "reason": "shape"}]}))
