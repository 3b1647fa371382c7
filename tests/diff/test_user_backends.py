"""KernelDiff with the backends and models a user writes (issue 48, items 1, 2 and 14):

* a backend that edits the graph it is given in place still gets a verified repro: every graph the
  tool hands to a backend is a copy it never reuses (the harness's compile, the minifier's replays);
* the float64 reference widens what a model narrows (``.float()``, ``.to(h.dtype)`` baked into a
  graph), and a reference that still cannot run says so with a DF code and a hint, never a raw
  traceback;
* a gradient-only failure against eager ends in a verified repro."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from debug_framework.errors import BackendRuntimeError
from debug_module.diff import KernelDiffHarness
from debug_module.minifier import AccuracySignature, _runtime

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"kd_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # the minifier finds a backend's source file through it
    spec.loader.exec_module(mod)
    return mod


ib, pm = _load("inplace_backends"), _load("pinned_models")


def _cli(args: list[str], capsys) -> tuple[int, dict]:
    from debug_module.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------ item 1: graphs handed to a backend


def _graph():
    model, (x,) = pm.exp_mlp()
    gm = torch.fx.symbolic_trace(model)
    return gm, [x]


@pytest.mark.parametrize("backend", [ib.exp_to_expm1, ib.add_to_sub, ib.mul_constant_args])
def test_the_minifiers_oracle_hands_the_backend_a_copy(backend):
    """An in-place backend changes neither the graph the oracle judges nor its eager baseline: the
    failure is seen, in eager and float64 mode, and the graph's code is what it was."""
    for reference in ("eager", "float64"):
        gm, inputs = _graph()
        code = gm.code
        from debug_framework.comparison import RatioRule

        sig = AccuracySignature(backend, reference=reference,
                                ratio=RatioRule(2.0, 1e-5, "rmse") if reference == "float64" else None)
        holds, obs = sig.check(gm, inputs)
        assert holds, obs
        assert gm.code == code, f"{backend.__name__} changed the tool's graph"


@pytest.mark.parametrize("backend", [ib.exp_to_expm1, ib.add_to_sub, ib.mul_constant_args])
def test_the_harness_keeps_the_graph_it_gave_the_backend_unchanged(backend):
    model, inputs = pm.exp_mlp()
    harness = KernelDiffHarness(model, inputs, test_backend=backend, runs=1, minify_on_failure=False)
    report = harness.compare()
    assert not report.passed, report.summary()
    (gm, graph_inputs), = harness._test_side.timed.graphs
    with torch.no_grad():  # the kept graph still computes what the model does
        assert torch.allclose(gm(*graph_inputs)[0], model(*inputs)), gm.code
    assert not any(n.meta.get("rewritten") for n in gm.graph.nodes)


def test_an_in_place_backend_gets_a_verified_repro_from_one_command(tmp_path, capsys):
    """The issue's command: ``diff --model m.py:make_model --inputs m.py:make_inputs --backend
    bug.py:backend`` where the backend edits ``gm`` in place (exp -> expm1)."""
    code, doc = _cli(["--root", str(tmp_path / "art"), "--json", "diff",
                      "--model", f"{HERE / 'pinned_models.py'}:make_exp_mlp",
                      "--inputs", f"{HERE / 'pinned_models.py'}:make_exp_mlp_inputs",
                      "--backend", f"{HERE / 'inplace_backends.py'}:exp_to_expm1", "--runs", "1"], capsys)
    data = doc["data"]
    m = data["minifier"]
    assert code == 1 and m["status"] == "ran" and m["verified"] is True, m
    assert data["repro"] and Path(data["repro"], "repro.py").is_file(), data
    assert m["nodes"] == 1 and "exp" in m["detail"], m


def _fc1_plus_tenth_docs_model():
    import torch.nn as nn

    class TinyMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    torch.manual_seed(0)
    return TinyMLP(), torch.randn(4, 16)


def test_the_docs_buggy_backend_minifies_to_a_verified_repro(tmp_path):
    """``docs/kerneldiff.md``'s own ``buggy_backend`` (adds 0.1 to fc1's output, editing ``gm`` in place),
    module-level here so the repro can import it, minifies and verifies."""
    model, x = _fc1_plus_tenth_docs_model()
    report = KernelDiffHarness(model, (x,), test_backend=ib.fc1_plus_tenth, runs=1,
                               artifact_root=tmp_path, minify_max_seconds=60).compare()
    m = report.minifier
    assert not report.passed and m["status"] == "ran" and m["nodes"] == 1, m
    assert m["verified"] is True, m


# ------------------------------------------------------------------ item 2: a reference that narrows


def test_the_float64_reference_widens_a_float_cast():
    """``.float()`` inside the model: the float64 reference keeps float64 (as ``float64_eager`` does)
    and a correct backend passes."""
    model, inputs = pm.pins_float()
    report = KernelDiffHarness(model, inputs, test_backend="aot_eager", runs=1).compare()
    assert report.passed, report.summary()
    assert report.reference_backend == "float64"


def test_a_to_dtype_baked_into_the_graph_minifies_quietly(tmp_path, capfd):
    """``.to(h.dtype)``: Dynamo bakes float32 into the graph; the minifier's float64 reference widens it
    too, the in-place bug is reduced and verified, and nothing is dumped on stderr."""
    model, inputs = pm.pins_to_dtype()
    report = KernelDiffHarness(model, inputs, test_backend=ib.exp_to_expm1, runs=1, artifact_root=tmp_path,
                               minify_max_seconds=60).compare()
    m = report.minifier
    assert not report.passed and m["status"] == "ran" and m["verified"] is True, m
    err = capfd.readouterr().err
    assert "Traceback" not in err and "FX-traced" not in err, err


def test_a_reference_that_cannot_run_says_so_with_a_code_and_hint():
    model, inputs = pm.float32_only()
    with pytest.raises(BackendRuntimeError) as info:
        KernelDiffHarness(model, inputs, test_backend="aot_eager", runs=1).compare()
    e = info.value
    assert e.code == "DF005" and "float64 reference" in e.message and "TypeError" in e.message, e
    assert "--reference eager" in e.hint, e.hint


def test_the_cli_reports_a_failing_reference_with_its_code(tmp_path, capsys):
    code, doc = _cli(["--root", str(tmp_path / "art"), "--json", "diff",
                      "--model", f"{HERE / 'pinned_models.py'}:float32_only", "--backend", "aot_eager",
                      "--runs", "1"], capsys)
    err = doc["error"]
    assert code == 2 and err["hint"] and "float64 reference" in err["message"], doc


# ------------------------------------------------------------------ item 14: gradient-only, against eager


def test_fresh_copies_expanded_tensors():
    """An expanded (stride-0) tensor, as a backward graph's ``expand`` makes, is copied with its strides."""
    x = torch.tensor(2.0).expand(3)
    (c,) = _runtime.fresh([x])
    assert c.stride() == x.stride() and torch.equal(c, x) and c.data_ptr() != x.data_ptr()


@pytest.mark.slow
def test_a_gradient_only_failure_against_eager_gets_a_verified_repro(tmp_path, capsys):
    """The issue's case: bf16 ``margin_ranking_loss`` on the hinge, ``--gradients --reference eager``."""
    code, doc = _cli(["--root", str(tmp_path / "art"), "--json", "diff",
                      "--model", f"{HERE / 'pinned_models.py'}:margin_bf16", "--gradients",
                      "--reference", "eager", "--runs", "1"], capsys)
    data = doc["data"]
    m = data["minifier"]
    assert code == 1 and data["passed"] is False, data
    assert m["stage"] == "backward" and m["status"] == "ran" and m["verified"] is True, m
    assert data["repro"] is not None


# ------------------------------------------------------------------ item 14's general case


def test_the_compile_wrapper_keeps_expanded_inputs_with_their_strides():
    """The inputs a compiled graph is given are kept as copies with their strides, an expanded
    (stride-0) one too (``copy_`` into that layout is refused: the compile crashed)."""
    from debug_framework.measure import _snapshot

    x = torch.arange(4.0).expand(3, 4)
    c = _snapshot(x)
    assert c.stride() == (0, 1) and torch.equal(c, x) and c.data_ptr() != x.data_ptr()
    x.as_strided((4,), (1,)).add_(1.0)  # the original changes; the copy does not
    assert torch.equal(c[0], torch.arange(4.0))


@pytest.mark.slow
def test_an_expanded_graph_input_gets_a_verified_repro(tmp_path, capsys):
    """A graph after a graph break takes a stride-0 tensor: the diff keeps it, the repro stores it and
    its ``load()`` restores the stride-0 layout in a fresh process (verified)."""
    code, doc = _cli(["--root", str(tmp_path / "art"), "--json", "diff",
                      "--model", f"{HERE / 'pinned_models.py'}:make_expanded_after_break",
                      "--inputs", f"{HERE / 'pinned_models.py'}:make_expanded_after_break_inputs",
                      "--backend", f"{HERE / 'inplace_backends.py'}:exp_to_expm1", "--runs", "1"], capsys)
    data = doc["data"]
    assert code == 1 and data is not None, doc
    m = data["minifier"]
    assert m["status"] == "ran" and m["verified"] is True, m
    spec = json.loads(Path(data["repro"], "repro.json").read_text())["check"]
    assert [i["stride"] for i in spec["inputs"]] == [[0, 1]], spec["inputs"]


def test_a_gradient_failure_no_isolated_backward_graph_shows_ends_in_a_line_saying_why(tmp_path):
    """A bug in the backend's backward compiler alone: each AOT backward graph handed to the backend
    on its own is compiled correctly, so no isolated graph reproduces it; the diff fails and its
    minifier outcome says there is no repro and why."""
    bb = _load("bug_backends")
    model, inputs = pm.exp_mlp()
    report = KernelDiffHarness(model, inputs, test_backend=bb.backward_scaled, runs=1, compare_gradients=True,
                               artifact_root=tmp_path, minify_max_seconds=30).compare()
    m = report.minifier
    assert report.forward_passed and report.gradients_passed is False, report.summary()
    assert m["status"] == "not_reproduced" and m["stage"] == "backward" and report.repro_path is None, m
    assert m["detail"].startswith("no repro:") and "joint forward-and-backward compile" in m["detail"], m
    assert "no repro:" in report.summary()
