"""The drill-down's parts: configuration, the strategy registry, the stage's "no strategy" entry,
graph alignment, and the terminal and HTML views (every value literal / escaped)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from debug_framework.capture.keys import CheckpointKey
from debug_framework.errors import ValidationError
from debug_framework.services.drilldown import STRATEGY_FACTORIES, Culprit, LayerDrilldown, OperatorRow, choose_strategy

HOSTILE = "<script>alert(1)</script>[bold red]x[/]"


def _entry() -> LayerDrilldown:
    rows = [OperatorRow(0, "mm", "aten.mm.default", "m.layers.0.mlp", "a.py:1", 1e-8, 0.0, 1e-7),
            OperatorRow(1, "gelu", "aten.gelu.default", HOSTILE, HOSTILE, 1e-3, 1e-8, 1e-7)]
    return LayerDrilldown(layer=0, checkpoint="post_mlp:0", backend=HOSTILE, method="replay", operators=rows,
                          culprit=Culprit("aten.gelu.default", "gelu", HOSTILE, HOSTILE, repro_dir=HOSTILE, verified=True),
                          note=HOSTILE)


def test_drill_down_is_a_checked_session_key():
    from debug_framework.cli.debug_validate import ValidateOptions, _session_config
    from debug_framework.services.validation.plan import validate_session_config

    assert validate_session_config({})["drill_down"] is False
    assert validate_session_config({"drill_down": True})["drill_down"] is True
    with pytest.raises(ValidationError, match="drill_down must be true or false") as info:
        validate_session_config({"drill_down": "yes"})
    assert info.value.code == "DF005"
    assert _session_config(ValidateOptions(drill_down=True))["drill_down"] is True
    assert "drill_down" not in _session_config(ValidateOptions())


def test_strategies_say_why_they_do_not_apply_and_adding_one_is_one_line(monkeypatch):
    from debug_framework.backends.pytorch import PyTorchBackend
    from debug_framework.backends.torch_reference import TorchReferenceBackend

    strategy, why = choose_strategy(TorchReferenceBackend())
    assert strategy is None and "replay: 'torch_reference' does not run a torch nn.Module eagerly" in why
    assert choose_strategy(PyTorchBackend())[1].endswith("replay: the backend is not prepared)")

    class Always:
        name = "always"

        def applies(self, backend):
            return True, ""

    monkeypatch.setattr("debug_framework.services.drilldown.registry.STRATEGY_FACTORIES", [*STRATEGY_FACTORIES, Always])
    assert choose_strategy(TorchReferenceBackend())[0].name == "always"


def test_no_strategy_gives_an_entry_with_a_note_never_nothing():
    from debug_framework.backends.torch_reference import TorchReferenceBackend
    from debug_framework.services.validation.drill_stage import DrillDownStage

    from debug_framework.services.validation.judge import Verdict

    diverged = Verdict(checkpoints={}, layers=None, first_divergence=CheckpointKey("post_attention", 2), error_source=None)
    ctx = SimpleNamespace(verdict=diverged, alternative=TorchReferenceBackend(), drilldown=None)
    DrillDownStage().run(ctx)
    (entry,) = ctx.drilldown
    assert (entry.layer, entry.checkpoint, entry.method, entry.operators, entry.culprit) == (2, "post_attention:2", "none",
                                                                                             [], None)
    assert entry.note.startswith("no drill-down strategy applies to this backend (")
    for strategy in ("minifier", "onnx", "replay"):  # every strategy (installed ones first) says why not
        assert f"{strategy}: " in entry.note
    ctx.verdict = Verdict(checkpoints={}, layers=None, first_divergence=None, error_source=None)
    DrillDownStage().run(ctx)
    assert ctx.drilldown == []  # nothing diverged: nothing to drill
    from debug_framework.models.session_config import SessionConfig

    assert not DrillDownStage().applies(SessionConfig()) and DrillDownStage().applies(SessionConfig(drill_down=True))


def test_alignment_pairs_through_casts_and_names_a_changed_attribute():
    from torch.fx.experimental.proxy_tensor import make_fx

    from debug_framework.services.drilldown.align import align_graphs, attribute_differences

    def ref(x):
        return torch.nn.functional.gelu(x) * 2 + 1

    def alt(x):  # a cast inserted, and the tanh approximation
        return torch.nn.functional.gelu(x.to(torch.bfloat16).float(), approximate="tanh") * 2 + 1

    x = torch.randn(4)
    g_ref, g_alt = make_fx(ref)(x).graph, make_fx(alt)(x).graph
    al = align_graphs(g_alt, g_ref)
    nodes_alt, nodes_ref = {n.name: n for n in g_alt.nodes}, {n.name: n for n in g_ref.nodes}
    assert [str(nodes_alt[a].target) for a in al.pairs] == ["aten.gelu.default", "aten.mul.Tensor", "aten.add.Tensor"]
    assert al.alternative_only == [] and al.trusted_only == []
    gelu = next(a for a in al.pairs if "gelu" in a)
    assert attribute_differences(nodes_alt[gelu], nodes_ref[al.pairs[gelu]]) == [
        "approximate='tanh' where the reference has 'none'"]


def test_terminal_view_prints_values_literally():
    from rich.console import Console

    from debug_framework.cli.drilldown_view import print_drilldown

    console = Console(file=io.StringIO(), width=400, color_system=None)
    print_drilldown(console, {"drilldown": [_entry().to_dict()]})
    text = console.file.getvalue()
    assert "culprit aten.gelu.default at <script>alert(1)</script>[bold red]x[/]" in text
    assert "verified" in text and "1.00e-03" in text
    console = Console(file=io.StringIO(), width=200, color_system=None)
    print_drilldown(console, {"drilldown": []})
    assert "nothing to drill" in console.file.getvalue()


def test_html_section_escapes_everything():
    from debug_framework.models.validation_report import ValidationReport
    from debug_framework.reports import render_report

    report = ValidationReport(session_id="s1", overall_status="failed",
                              session={"session_id": "s1", "status": "failed",
                                       "results": {"verdict": "failed", "drilldown": [_entry().to_dict()]}})
    html = render_report(report, "html")
    assert 'id="drilldown"' in html and "aten.gelu.default" in html
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Other results" not in html  # shown in its own section, not again among the other keys
    no_drill = ValidationReport(session_id="s1", overall_status="passed",
                                session={"session_id": "s1", "status": "passed", "results": {"verdict": "passed"}})
    assert 'id="drilldown"' not in render_report(no_drill, "html")
    junit = render_report(report, "junit")
    assert 'name="drilldown_culprits" value="layer 0: aten.gelu.default at &lt;script&gt;' in junit
    assert "drilldown_culprits" not in render_report(no_drill, "junit")


def test_rms_error_flags_every_non_finite_mismatch():
    """A non-finite value is error unless it is the trusted value itself (or a trusted value past
    the dtype's range rounded to the infinity of its sign)."""
    from debug_framework.services.drilldown.judge import rms_error

    inf, nan = float("inf"), float("nan")
    t = torch.tensor
    assert rms_error(t([inf, 1.0]), t([-inf, 1.0], dtype=torch.float64)) == inf
    assert rms_error(t([nan, 1.0]), t([inf, 1.0], dtype=torch.float64)) == inf
    assert rms_error(t([nan, 1.0]), t([-inf, 1.0], dtype=torch.float64)) == inf
    assert rms_error(t([-inf, 1.0]), t([nan, 1.0], dtype=torch.float64)) == inf
    assert rms_error(t([1.0, 1.0]), t([nan, 1.0], dtype=torch.float64)) == inf
    assert rms_error(t([inf, 1.0]), t([inf, 1.0], dtype=torch.float64)) == 0.0   # the same value
    assert rms_error(t([nan, 1.0]), t([nan, 1.0], dtype=torch.float64)) == 0.0
    assert rms_error(t([-inf, 1.0]), t([-1e300, 1.0], dtype=torch.float64)) == 0.0  # a mask's minus infinity cast down
    assert rms_error(t([inf, 1.0]), t([-1e300, 1.0], dtype=torch.float64)) == inf


def test_a_compiled_layer_that_cannot_run_alone_is_said_and_eager_backends_are_not_checked():
    """The compiler check of replay: a dynamo backend that fails on the layer alone gives a note but
    no compiler finding (the eager culprit stays); eager-equivalent backends and plain modules are
    not checked at all."""
    from types import SimpleNamespace

    from debug_framework.services.drilldown.layer_graph import capture_layer_call, trace_layer
    from debug_framework.services.drilldown.replay import _compiler_differs

    def broken(gm, example_inputs):
        raise RuntimeError("no kernel for this")

    net = torch.nn.Sequential(torch.nn.Linear(4, 4))
    call = capture_layer_call(net, "0", {"input": torch.randn(2, 4)})
    graph = trace_layer(net, "0", call, call.hidden)
    request = SimpleNamespace(noise_margin=4.0, floor_eps=1.0)
    note, bug = _compiler_differs(torch.compile(net, backend=broken), net, graph, call, request)
    assert not bug and note.startswith("the layer compiled alone with dynamo backend 'broken' could not be run (")
    assert "no kernel for this" in note
    assert _compiler_differs(torch.compile(net, backend="eager"), net, graph, call, request) == ("", False)
    assert _compiler_differs(net, net, graph, call, request) == ("", False)
