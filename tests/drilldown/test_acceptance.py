"""Injected single-operator bugs are named exactly by the drill-down, with a verified repro; a
correct backend drills to no culprit; the result survives JSON, the database and the reports."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


def _introducing_before(entry, culprit_node):
    """Rows before the culprit (graph order) that introduce error: none by definition of the culprit."""
    rows = entry.operators
    idx = [r.node for r in rows].index(culprit_node)
    return [r for r in rows[:idx] if r.introduces]


@pytest.mark.slow
def test_docs_example_gelu_tanh_is_named_and_survives_json_database_and_html(tiny, bug_backend, tmp_path,
                                                                             monkeypatch, capsys):
    """Acceptance (1): a module backend computing gelu with the tanh approximation in layer 1: the
    culprit is aten.gelu in that layer's module, its repro fails alone; the docs example as written."""
    from debug_framework.models.validation_report import ValidationReport
    from debug_framework.reports import render_report
    from debug_framework.services.drilldown import LayerDrilldown

    bug_backend("gelu_variant")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-bert").symlink_to(tiny("bert"))
    (block,) = re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", (ROOT / "docs" / "drilldown.md").read_text(), re.S)
    scope: dict = {"__name__": "__doc_example__"}
    exec(compile(block, "drilldown.md", "exec"), scope)
    out = capsys.readouterr().out
    assert "layer 1: aten.gelu.default at encoder.layer.1.intermediate.intermediate_act_fn" in out, out
    assert "repro verified: True" in out and re.search(r"aten.gelu.default: introduced \d\.\d\de-0\d > bound", out), out

    result, engine = scope["result"], scope["engine"]
    (entry,) = result.drilldown
    assert entry.method == "replay" and entry.layer == 1 and entry.checkpoint == "post_mlp:1"
    c = entry.culprit
    assert c.op == "aten.gelu.default" and c.module_path.startswith("encoder.layer.1.") and c.verified
    assert _introducing_before(entry, c.node) == []
    assert "approximate='tanh' where the reference has 'none'" in entry.note
    gelu = next(r for r in entry.operators if r.node == c.node)
    assert gelu.margin > 10 and gelu.carried_in < gelu.bound  # introduced here, not carried in
    later = [r for r in entry.operators if r.index > gelu.index]
    assert later and all(not r.introduces for r in later) and max(r.carried_in for r in later) > gelu.bound

    # the repro runs alone, fails while the bug is there; no pickle anywhere
    repro = Path(c.repro_dir)  # relative to the working directory when the database path is
    assert sorted(p.name for p in repro.iterdir()) == ["inputs.safetensors", "repro.json", "repro.py", "verify.log"]
    done = subprocess.run([sys.executable, "repro.py"], cwd=repro, capture_output=True, text=True, timeout=300)
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("REPRO: reproduced: aten.gelu.default"), done.stdout + done.stderr

    # JSON round trip, the stored session, the reports
    as_json = json.loads(json.dumps(result.to_dict()))
    assert [LayerDrilldown.from_dict(d).to_dict() for d in as_json["drilldown"]] == as_json["drilldown"]
    assert LayerDrilldown.from_dict(as_json["drilldown"][0]).culprit == c
    report = ValidationReport.from_session(result.session_id, engine.db)
    stored = report.session["results"]["drilldown"]
    assert stored == as_json["drilldown"]
    assert json.loads(render_report(report, "json"))["session"]["results"]["drilldown"][0]["culprit"]["op"] == c.op
    html = render_report(report, "html")
    assert 'id="drilldown"' in html and "aten.gelu.default" in html and "encoder.layer.1.intermediate" in html


@pytest.mark.slow
def test_cli_drill_down_names_the_reduced_precision_softmax(tiny, tmp_path, capsys):
    """Acceptance (2), through ``debug_validate --drill-down``: softmax computed in bfloat16 inside a
    float32 run, in layer 1 of a Llama: the culprit is the cast of its scores to bfloat16, at the
    line that computes the softmax."""
    from debug_framework.cli.debug_validate import run

    backend_file = tmp_path / "bugs.py"
    backend_file.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                            "from benchmarks.injected_bugs import register_bug_backend\n"
                            "register_bug_backend('reduced_precision_softmax')\n", encoding="utf-8")
    out_file = tmp_path / "out.json"
    code = run(["--model-path", str(tiny("llama")), "--backend-file", str(backend_file), "--alternative-backend",
                "hf_bug_reduced_precision_softmax", "--dtype", "float32", "--drill-down", "--database",
                str(tmp_path / "s.db"), "--output-file", str(out_file)])
    out = capsys.readouterr().out
    assert code == 1, out
    flat = " ".join(out.split())
    # the scores cast to bfloat16 for the softmax, on the softmax's line: where the precision goes (an
    # operator's bound leaves out the mask's finfo.min sentinels, so the cast is no longer hidden)
    assert "layer 1: culprit aten._to_copy.default at model.layers.1.self_attn (injected_bugs.py:" in flat, out
    assert "verified" in flat and "not verified" not in flat
    doc = json.loads(out_file.read_text())
    (entry,) = doc["drilldown"]
    assert entry["culprit"]["op"] == "aten._to_copy.default" and entry["culprit"]["verified"]
    rows = entry["operators"]
    culprit_index = next(r["index"] for r in rows if r["node"] == entry["culprit"]["node"])
    assert not any(r["introduces"] for r in rows if r["index"] < culprit_index)


@pytest.mark.slow
def test_a_wrong_plugin_kernel_is_named(tiny, buggy_gelu_plugin, tmp_path):
    """Acceptance (3): a plugin whose Triton kernel for aten::gelu is wrong: the drill-down names
    aten.gelu in the first layer's MLP, and the repro (which loads the plugin) fails alone."""
    from debug_framework.services.compilation_engine import CompilationEngine
    from debug_framework.services.plugin_registry import PluginRegistry
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(tmp_path / "s.db")
    name = PluginRegistry(engine.db, engine=CompilationEngine(tmp_path / "builds")).swap_in(buggy_gelu_plugin)
    result = engine.run(engine.create_session(tiny("bert"), {"drill_down": True, "layers": [0, 1]},
                                              "python_reference", name))
    assert result.verdict == "failed"
    (entry,) = result.drilldown
    c = entry.culprit
    assert (entry.layer, c.op, c.module_path) == (0, "aten.gelu.default", "encoder.layer.0.intermediate.intermediate_act_fn")
    assert c.verified and entry.note == ""  # the plugin's graph is the stock graph: nothing differs but the kernel


def _drill_layer_1(model_dir, backend_name, dtype, out_dir):
    from debug_framework.backends import get_backend
    from debug_framework.modelio import ModelInputs, load_model
    from debug_framework.services.drilldown import DrillRequest, choose_strategy

    model = load_model(model_dir)
    inputs = ModelInputs.random(model.config.vocab_size, 2, 16, seed=0)
    ref = get_backend("python_reference")
    ref.prepare(model, "float64")
    hidden = ref.run(inputs, capture_layer_inputs=True).layer_inputs[1]
    alt = get_backend(backend_name)
    alt.prepare(model, dtype)
    strategy, why = choose_strategy(alt)
    assert strategy is not None and strategy.name == "replay", why
    return alt, strategy.drill(DrillRequest(layer=1, checkpoint="post_mlp:1", backend=alt, model=model, inputs=inputs,
                                            hidden_in=hidden, dtype=dtype, device="cpu", out_dir=out_dir))


@pytest.mark.parametrize(("family", "dtype"), [("bert", "float32"), ("llama", "bfloat16")])
def test_a_correct_backend_drills_to_no_culprit(family, dtype, tiny, bug_backend, tmp_path):
    """Acceptance (4): no false alarm: every operator of a correct layer within its bound."""
    alt, entry = _drill_layer_1(tiny(family), bug_backend(None), dtype, tmp_path)
    assert entry.culprit is None and entry.introducing == []
    assert len(entry.operators) > 20 and all(not math.isnan(r.margin) for r in entry.operators)
    assert max(r.margin for r in entry.operators) < 0.5  # well inside: the stock operator's own noise
    assert entry.note.startswith("no operator introduces error beyond its bound")
    assert json.loads((tmp_path / "layer_graph.json").read_text())["layer"] == alt.layer_modules[1]


@pytest.mark.slow
def test_a_torch_compile_module_backend_is_drilled_through_its_original_module(tiny, tmp_path):
    """A module backend whose builder returns ``torch.compile(net)``: its layer is traced from the
    original module (the operators it asks for, run eagerly) and the tanh GELU is still named."""
    import torch

    from debug_framework.backends import module_backend, register_backend, unregister_backend
    from debug_framework.backends.pytorch import build_hf_model

    from benchmarks.injected_bugs import BUGS

    def build(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        BUGS["gelu_variant"].patch(net, 1)
        return torch.compile(net, backend="eager")

    register_backend("compiled_gelu_bug", module_backend("compiled_gelu_bug", build), replace=True)
    try:
        _, entry = _drill_layer_1(tiny("bert"), "compiled_gelu_bug", "float32", tmp_path)
    finally:
        unregister_backend("compiled_gelu_bug")
    assert entry.culprit.op == "aten.gelu.default" and entry.culprit.verified
    assert entry.culprit.module_path == "encoder.layer.1.intermediate.intermediate_act_fn"


@pytest.mark.slow
def test_without_a_trusted_layer_imprecision_is_still_named_and_the_note_says_what_is_lost(tiny, bug_backend,
                                                                                          tmp_path, monkeypatch):
    """No Hugging Face layer to trust (another architecture, another call signature): the
    alternative's own graph in float64 is trusted; the bfloat16 softmax (imprecision) is still named,
    and the note says a wrong function would not be."""
    from debug_framework.services.drilldown.replay import ReplayStrategy

    monkeypatch.setattr(ReplayStrategy, "_trusted_layer", lambda self, model, name: (None, "no such architecture"))
    _, entry = _drill_layer_1(tiny("llama"), bug_backend("reduced_precision_softmax"), "float32", tmp_path)
    assert entry.culprit.op == "aten._to_copy.default" and entry.culprit.module_path == "model.layers.1.self_attn"
    assert "no correct implementation of the layer to trust (no such architecture)" in entry.note
    assert "cannot be seen" in entry.note


class _ScaledGelu:
    """An activation with an extra operator the reference lacks: ``gelu(y * 1.05)``."""

    @staticmethod
    def make():
        import torch

        class ScaledGelu(torch.nn.Module):
            def forward(self, y):
                return torch.nn.functional.gelu(y * 1.05)

        return ScaledGelu()


def _register(name, patch, wrap=lambda net: net):
    from debug_framework.backends import module_backend, register_backend
    from debug_framework.backends.pytorch import build_hf_model

    def build(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        patch(net)
        return wrap(net)

    register_backend(name, module_backend(name, build), replace=True)
    return name


def test_an_operator_only_the_alternative_has_is_named_not_the_one_it_feeds(tiny, tmp_path):
    """``y * 1.05`` inserted before layer 1's gelu: the mul (the alternative's extra operator) is the
    culprit, not the gelu judged on the mul's output; the gelu on the reference's input is correct."""
    from debug_framework.backends import unregister_backend

    def patch(net):
        net.encoder.layer[1].intermediate.intermediate_act_fn = _ScaledGelu.make()

    name = _register("extra_mul_gelu", patch)
    try:
        _, entry = _drill_layer_1(tiny("bert"), name, "float32", tmp_path)
    finally:
        unregister_backend(name)
    c = entry.culprit
    assert (c.op, c.module_path) == ("aten.mul.Tensor", "encoder.layer.1.intermediate.intermediate_act_fn"), entry.note
    assert c.source.startswith("test_acceptance.py:")
    gelu = next(r for r in entry.operators if r.op == "aten.gelu.default")
    assert not gelu.introduces and gelu.carried_in > gelu.bound  # its input's error is carried in from the mul
    assert [r.node for r in entry.introducing] == [c.node]
    assert f"the culprit aten.mul.Tensor ({c.node}) is an operator only the alternative has" in entry.note
    assert "which only the alternative has, feeds aten.gelu.default" in entry.note


def test_without_transformers_model_or_repro_the_table_is_kept(tiny, bug_backend, tmp_path, monkeypatch):
    """transformers cannot build the architecture (ValueError: unknown model type) and the repro
    cannot be written: the alternative's own graph is trusted, the table and culprit are kept, the
    note says both."""
    import torch

    import debug_framework.backends.pytorch as hf
    import debug_framework.services.drilldown.replay as replay

    build = hf.hf_skeleton

    def unknown(model, dtype, *, meta=False):  # the alternative's own (float32) build works; the trusted
        if dtype == torch.float64:               # float64 skeleton not
            raise ValueError("Unrecognized model identifier: nosuchmodel")
        return build(model, dtype, meta=meta)

    def unwritable(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(hf, "hf_skeleton", unknown)
    monkeypatch.setattr(replay, "write_and_verify", unwritable)
    _, entry = _drill_layer_1(tiny("llama"), bug_backend("reduced_precision_softmax"), "float32", tmp_path)
    assert entry.culprit.op == "aten._to_copy.default" and entry.culprit.module_path == "model.layers.1.self_attn"
    assert entry.culprit.repro_dir is None and not entry.culprit.verified and len(entry.operators) > 20
    assert "no correct implementation of the layer to trust (the Hugging Face layer cannot be built: ValueError: " \
           "Unrecognized model identifier: nosuchmodel)" in entry.note
    assert "the culprit's repro could not be written: OSError: disk full" in entry.note


def _perturbing_backend(scale):
    """A dynamo backend whose FX pass multiplies every gelu's output by ``scale`` (a compiler bug
    when ``scale != 1``; a correct non-eager compiler otherwise)."""

    def scaled(fn):
        return lambda *args, **kwargs: fn(*args, **kwargs) * scale

    def perturb_gelu(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "gelu" in getattr(node.target, "__name__", ""):
                node.target = scaled(node.target)
        gm.recompile()
        return gm.forward

    perturb_gelu.__name__ = f"perturb_gelu_{scale}"
    return perturb_gelu


@pytest.mark.slow
def test_a_compiler_bug_is_said_plainly_and_no_eager_operator_is_named(tiny, tmp_path):
    """A module backend compiled with a custom dynamo backend whose FX pass scales gelu's output
    (the eager code is correct): the drill-down says the compiled layer differs from its own eager
    code and names no culprit; with a correct custom backend the layer drills as before."""
    import torch

    from debug_framework.backends import unregister_backend

    backend = _perturbing_backend(1.01)
    name = _register("compiled_perturb_gelu", lambda net: None,
                     wrap=lambda net: torch.compile(net, backend=backend))
    try:
        alt, entry = _drill_layer_1(tiny("bert"), name, "float32", tmp_path)
    finally:
        unregister_backend(name)
    assert entry.culprit is None and not (tmp_path / "repro").exists(), entry.note
    assert entry.note.startswith("the compiled layer differs from its own eager code"), entry.note
    assert "dynamo backend 'perturb_gelu_1.01'" in entry.note and "minifier" in entry.note
    assert len(entry.operators) > 20 and entry.introducing == []  # the eager code's table, nothing in it

    # a correct non-eager compiler agrees with the eager code: the drill-down goes on as for eager
    from types import SimpleNamespace

    from debug_framework.modelio import ModelInputs, load_model
    from debug_framework.services.drilldown.layer_graph import capture_layer_call, trace_layer
    from debug_framework.services.drilldown.replay import _compiler_differs

    eager, layer_name = alt.module._orig_mod, alt.layer_modules[1]
    call = capture_layer_call(eager, layer_name, ModelInputs.random(load_model(tiny("bert")).config.vocab_size, 2, 16,
                                                                  seed=0).torch("cpu"))
    graph = trace_layer(eager, layer_name, call, call.hidden)
    request = SimpleNamespace(noise_margin=4.0, floor_eps=1.0)
    assert _compiler_differs(torch.compile(eager, backend=_perturbing_backend(1.0)), eager, graph, call,
                             request) == ("", False)
