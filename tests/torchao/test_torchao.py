"""torchao-quantized module backends (docs/torchao.md): their weights recognised (int8 weight-only,
int8 dynamic activation, the CPU int4 path), judged at their quantization with ``--dtype auto``
(the calibration quantized by torchao itself), named by their scheme in ``consistent_with`` at
float32, and drilled through: each quantized linear one operator, named by its kernel or by its
weight's dequantize step, at the module that introduces the error."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

torchao = pytest.importorskip("torchao")

from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig  # noqa: E402
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,  # noqa: E402
                                  quantize_)

from debug_framework.backends import module_backend, register_backend, unregister_backend  # noqa: E402
from debug_framework.backends.pytorch import build_hf_model  # noqa: E402
from debug_framework.backends.quantized import quantized_modules, quantized_operators  # noqa: E402
from debug_framework.backends.torchao.weights import config_for, dequantized, torchao_weights  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"int8_weight_only": Int8WeightOnlyConfig, "int8_dynamic_activation_int8_weight": Int8DynamicActivationInt8WeightConfig,
           "int4_weight_only": lambda: PrototypeInt4WeightOnlyConfig(group_size=32)}
KERNELS = {"int8_weight_only": "aten.mm.default", "int8_dynamic_activation_int8_weight": "aten._int_mm.default",
           "int4_weight_only": "aten._weight_int4pack_mm_for_cpu.default"}


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _quantized(scheme: str) -> _Block:
    torch.manual_seed(0)
    block = _Block().eval()
    quantize_(block, CONFIGS[scheme]())
    return block


@pytest.mark.parametrize("scheme", list(CONFIGS))
def test_each_scheme_is_recognised_and_quantized_again_the_same_way(scheme):
    block = _quantized(scheme)
    found = torchao_weights(block)
    assert [(w.module, w.scheme) for w in found] == [("up", scheme), ("down", scheme)]
    assert {w.group_size for w in found} == ({32} if scheme == "int4_weight_only" else {None})

    class Backend:  # what the diagnosis reads of a module backend: its module
        module = block

    assert quantized_operators(Backend()) == {scheme: 2}
    assert quantized_modules(Backend())[0] == {"module": "up", "scheme": scheme, "group_size": found[0].group_size,
                                               "tensor": found[0].tensor}
    torch.manual_seed(0)
    again = _Block().eval()  # the same float weights, quantized by the configuration read back
    quantize_(again.up, config_for(found[0]), filter_fn=lambda m, fqn: m is again.up)
    assert torch.equal(dequantized(again.up.weight), dequantized(block.up.weight))
    assert torchao_weights(_Block()) == []


@pytest.mark.parametrize("scheme", list(CONFIGS))
def test_a_traced_layer_holds_each_quantized_linear_as_one_operator_named_by_its_kernel(scheme):
    """Tracing used to fail inside torchao (``NotImplementedError: Int8Tensor dispatch: ... aten.t``)."""
    from debug_framework.backends.torchao.leaves import is_quantized_call, kernel_of
    from debug_framework.services.drilldown.layer_graph import LayerCall, run_graph, trace_layer

    holder = torch.nn.Module()
    holder.block = _quantized(scheme)
    x = torch.randn(2, 3, 64)
    graph = trace_layer(holder, "block", LayerCall(x, (), {}, False), x)
    calls = [n for n in graph.gm.graph.nodes if is_quantized_call(n)]
    assert [kernel_of(n) for n in calls] == [KERNELS[scheme]] * 2
    assert any(p.startswith("param:up.weight.") for p in graph.input_paths)
    out = run_graph(graph, graph.inputs)[calls[-1].name]
    with torch.no_grad():
        assert torch.equal(out, holder.block(x))  # the graph computes what the module does


@pytest.fixture(scope="module")
def llama(tiny):
    return tiny("llama")


def _session(model: Path, tmp_path: Path, build, config: dict[str, object]):
    from debug_framework.services.validation_engine import ValidationEngine

    register_backend("ao_test", module_backend("ao_test", build), replace=True)
    try:
        engine = ValidationEngine(tmp_path / "debug.db")
        sid = engine.create_session(model, config, "python_reference", "ao_test")
        return engine.run(sid), engine.db.sessions.get(sid)
    finally:
        unregister_backend("ao_test")


def _int8(model, dtype, device):
    net = build_hf_model(model, dtype, device)
    quantize_(net, Int8WeightOnlyConfig())
    return net


def test_a_quantized_module_declares_its_precision_on_the_one_seam(llama):
    """The module backend declares its torchao scheme as llama.cpp declares its file's type (the
    services read it through capabilities.emulated_precision): no torchao branch in the pipeline."""
    from debug_framework.backends.capabilities import emulated_precision
    from debug_framework.backends.torchao.reference import TorchaoReferenceBackend
    from debug_framework.modelio.loader import load_model

    model = load_model(llama)
    backend = module_backend("ao_seam", _int8)()
    precision = emulated_precision(backend, model)
    assert precision is not None and (precision.name, precision.dtype) == ("int8_weight_only", "float32")
    assert precision.describe() == "torchao int8_weight_only at 22 modules, float32 elsewhere"
    trusted = precision.trusted_backend()
    assert isinstance(trusted, TorchaoReferenceBackend) and trusted.alternative is backend
    assert emulated_precision(trusted, model) is None  # the trusted emulation declares nothing itself
    assert emulated_precision(module_backend("ao_plain", build_hf_model)(), model) is None


def test_int8_passes_at_its_quantization_and_fails_at_float32_consistent_with_it(llama, tmp_path):
    """At float32 it used to fail with consistent_with null, an empty quantized section and a
    drill-down that crashed in every layer."""
    auto, row = _session(llama, tmp_path, _int8, {"dtype": "auto", "layers": [0, 2]})
    assert auto.verdict == "passed" and auto.alternative_dtype == "float32"
    assert row["config"]["calibration_backend"] == "auto" and row["config"]["emulated_precision"] == "int8_weight_only"
    info = row["alternative_backend_info"]
    assert "torchao int8_weight_only at" in info["dtype_because"]
    assert info["quantized_modules"][0] == {"module": "model.layers.0.self_attn.q_proj", "scheme": "int8_weight_only",
                                            "group_size": None, "tensor": "Int8Tensor"}

    f32, row = _session(llama, tmp_path, _int8, {"dtype": "float32", "layers": [0, 1], "drill_down": True})
    assert f32.verdict == "failed" and f32.consistent_with == "int8_weight_only"
    assert row["config"]["calibration_backend"] == "auto" and row["config"]["emulated_precision"] is None
    note = f32.precision_diagnosis
    assert note["measured"][0] == "int8_weight_only" and note["quantized"] == {"int8_weight_only": 22}
    assert note["emulated"] == {"int8_weight_only": "float32"}  # the one precision seam llama.cpp's q8_0 uses
    assert {"module": "model.layers.0.self_attn.q_proj", "scheme": "int8_weight_only", "group_size": None,
            "tensor": "Int8Tensor"} in note["quantized_modules"]
    assert all(r.to_dict()["consistent_with"] == "int8_weight_only" for r in f32.results if not r.passed)
    (entry,) = f32.drilldown  # drilled through its quantized weights (it failed in torchao's dispatch before)
    assert (entry.culprit.op, entry.culprit.module_path) == ("aten.mm.default", "model.layers.0.self_attn.q_proj")
    assert "the error is the quantization's; judge the model at its quantization with --dtype auto" in entry.note
    html = {s.verdict: _html(tmp_path, s.session_id) for s in (auto, f32)}  # the report's quantized section, both ways
    for page in html.values():
        section = page[page.index('<section id="quantized">'):].split("</section>", 1)[0]
        assert "<td>model.layers.0.self_attn.q_proj</td><td>int8_weight_only</td><td></td><td>Int8Tensor</td>" in section
        assert section.count("<tr>") == 1 + 22 and 'href="#quantized"' in page
    assert 'id="quantized-operators">quantized operators: int8_weight_only at 22' in html["failed"]


def _html(tmp_path: Path, session_id: str) -> str:
    from debug_framework.models.validation_report import ValidationReport
    from debug_framework.reports import render_report
    from debug_framework.services.validation_engine import ValidationEngine

    return render_report(ValidationReport.from_session(session_id, ValidationEngine(tmp_path / "debug.db").db), "html")


@pytest.mark.slow
def test_a_broken_quantized_layer_is_localized_and_drilled_to_its_weight(llama, tmp_path):
    """Int8 dynamic activation quantization with one layer's o_proj scales perturbed (x1.25 on a
    quarter of its rows): at --dtype auto every other layer passes as a correct int8 run, layer 0's
    attention introduces the error, and the drill-down names o_proj's dequantize step (with a
    verified repro), every quantized linear before it running aten._int_mm within its bound."""
    def broken(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        quantize_(net, Int8DynamicActivationInt8WeightConfig())
        w = net.get_submodule("model.layers.0.self_attn.o_proj").weight
        with torch.no_grad():
            w.scale[: w.scale.shape[0] // 4] *= 1.25
        return net

    result, _ = _session(llama, tmp_path, broken, {"dtype": "auto", "drill_down": True})
    assert result.verdict == "failed" and result.introducing_layers == [0]
    assert result.source.layer == 0 and result.source.block == "attention"
    (entry,) = result.drilldown
    culprit = entry.culprit
    assert culprit is not None, entry.note
    assert (culprit.op, culprit.module_path) == ("Int8Tensor.dequantize", "model.layers.0.self_attn.o_proj")
    assert culprit.verified and (Path(culprit.repro_dir) / "repro.py").is_file()
    before = [r for r in entry.operators if r.index < next(r.index for r in entry.operators if r.introduces)]
    quantized = [r for r in before if r.node.startswith("quantized_linear")]
    assert [r.module_path.rsplit(".", 1)[-1] for r in quantized] == ["q_proj", "k_proj", "v_proj"]
    assert all(r.op == "aten._int_mm.default" and not r.introduces for r in quantized)
    assert "3 torchao-quantized" not in entry.note and "torchao-quantized linears" in entry.note


@pytest.mark.slow
def test_the_docs_example_runs_as_written(llama, tmp_path, monkeypatch, capsys):
    """docs/torchao.md's doctest-bash block, in this process (its file written, each ``debug_validate``
    line run through the CLI's ``run``): one int8 module backend passed at --dtype auto, failed (exit 1,
    as the block's ``|| test $? -eq 1`` expects) at float32 consistent with int8_weight_only."""
    import shlex

    from debug_framework.cli.debug_validate import run

    text = (ROOT / "docs" / "torchao.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"<!-- doctest-bash -->\s*```bash\n(.*?)```", text, re.S)
    files = re.findall(r"cat > (\S+) <<'(\w+)'\n(.*?)\n\2\n", block, re.S)
    rest = block
    for name, end, body in files:
        rest = rest.replace(f"cat > {name} <<'{end}'\n{body}\n{end}\n", "")
    commands = [line for line in rest.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert [name for name, _, _ in files] == ["ao_backend.py"] and len(commands) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODEL", str(llama))
    monkeypatch.setenv("COLUMNS", "200")
    for name, _, body in files:
        (tmp_path / name).write_text(body + "\n", encoding="utf-8")
    try:
        out = []
        for line in commands:
            command, _, allowed = line.partition("||")
            argv = shlex.split(os.path.expandvars(command))
            assert argv[0] == "debug_validate"
            assert allowed.strip() in ("", "test $? -eq 1"), line  # only an expected exit 1 is allowed
            expected = 1 if allowed.strip() else 0
            assert run(argv[1:]) == expected, capsys.readouterr().err[-3000:]
            out.append(capsys.readouterr().out)
    finally:
        unregister_backend("ao_int8")  # the block's --backend-file registered it in this process
    assert "PASSED" in out[0] and "int8_weight_only" in out[1]