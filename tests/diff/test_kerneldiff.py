"""KernelDiff: acceptance cases (Inductor passes, a perturbed submodule is named first, a gradient-only bug
is found only by gradients), float64 ratio rule, nested/0-dim/HF outputs, NaN, nondeterminism, plots."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from debug_framework.comparison import compare
from debug_module.diff import KernelDiffHarness, compare_tensors
from debug_module.diff.visualization import error_heatmap

from .conftest import perturbing_backend, wrong_backward_backend


def test_compare_tensors_is_a_front_over_the_core():
    a = torch.randn(5, 7)
    b = a.clone()
    b[3, 4] += 1e-2
    b[0, 0] = float("nan")
    r = compare_tensors(a, b)
    core = compare(a, b)
    assert r.to_dict() == core.to_dict(json_compatible=True)
    assert not r.passed and r.max_absolute_error == core.max_abs_error
    assert r.worst_index == core.worst[0].index and r.nan_count == 1
    assert r.mismatch_percentage == core.mismatch_percent and r.rmse == core.rmse
    assert compare_tensors(a, a.clone()).passed


@pytest.mark.slow
def test_inductor_against_eager_passes_with_gradients_and_honest_timings(tiny):
    model, inputs = tiny
    report = KernelDiffHarness(model, inputs, model_name="tiny", compare_gradients=True, runs=3).compare()
    assert report.passed, report.summary()
    assert report.test_backend == "inductor" and report.reference_backend == "float64"  # the fair default
    assert {d.name for d in report.gradients} >= {"param.fc1.weight", "param.fc3.bias", "input.0"}
    t = report.timing["test"]
    assert t["graphs_compiled"] >= 1 and t["backend_compile_s"] > 0
    assert t["first_call_s"] >= t["backend_compile_s"]
    assert t["steady_state_s"]["samples"] == 2 and t["first_call_s"] > t["steady_state_s"]["median"]
    assert report.timing["reference"]["backend_compile_s"] is None
    assert "PASS" in report.summary().splitlines()[0]
    # the user's model is untouched (each side ran on its own copy)
    assert all(p.grad is None for p in model.parameters())


def test_perturbed_submodule_fails_and_is_named_first(tiny):
    model, inputs = tiny
    report = KernelDiffHarness(model, inputs, test_backend=perturbing_backend("fc2"), compare_modules=True,
                               runs=1, minify_on_failure=False).compare()
    assert not report.passed
    assert report.first_divergent_module == "fc2"
    by_module = {d.module: d.passed for d in report.modules}
    assert by_module["fc1"] and by_module["act"]  # upstream modules agree
    assert not by_module["fc3"]  # downstream modules diverge too, but later
    assert report.module_order.index("fc2") < report.module_order.index("fc3")
    assert "first divergent: fc2" in report.summary()
    assert report.minifier == {"status": "skipped", "detail": "minify_on_failure=False"}


def test_gradient_only_bug_found_by_gradients_not_by_forward(tiny):
    model, inputs = tiny
    fwd = KernelDiffHarness(model, inputs, test_backend=wrong_backward_backend, runs=1).compare()
    assert fwd.passed and not fwd.gradients  # forward comparison cannot see it
    both = KernelDiffHarness(model, inputs, test_backend=wrong_backward_backend, compare_gradients=True,
                             runs=1).compare()
    assert both.forward_passed and both.gradients_passed is False and not both.passed
    failed = [d.name for d in both.failed]
    assert failed and all(d.kind == "gradient" for d in both.failed)
    # its backward is a custom autograd Function, not an AOT backward graph: the minifier tried the
    # AOT backward graph of each compiled graph and says the failure does not show there
    assert both.minifier["stage"] == "backward" and both.minifier["status"] == "not_reproduced", both.minifier


def test_float64_reference_ratio_rule(tiny):
    model, inputs = tiny
    ok = KernelDiffHarness(model, inputs, reference_backend="float64", test_backend="aot_eager", runs=1).compare()
    assert ok.passed and ok.mode == "float64-ratio"
    d = ok.outputs[0]
    assert d.rule == "ratio" and d.ratio["test_error"] <= d.ratio["bound"]
    assert d.baseline is not None and d.baseline.reference_dtype == "float64"
    bad = KernelDiffHarness(model, inputs, reference_backend="float64", test_backend=perturbing_backend("fc1"),
                            runs=1, minify_on_failure=False).compare()
    assert not bad.passed and "RMSE" in bad.outputs[0].reason


class NestedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, scale):
        from transformers.modeling_outputs import BaseModelOutput

        h = self.fc(x) * scale
        return {"hf": BaseModelOutput(last_hidden_state=h, hidden_states=(x, h)),
                "loss": h.pow(2).mean(), "vec": h.sum(0), "cube": h.reshape(2, 3, 6)}


def test_nested_hf_zero_dim_outputs_and_dict_inputs():
    torch.manual_seed(0)
    inputs = {"x": torch.randn(6, 6), "scale": torch.tensor(0.5)}
    report = KernelDiffHarness(NestedNet(), inputs, test_backend="aot_eager", compare_gradients=True, runs=1).compare()
    names = {d.name for d in report.outputs}
    assert names == {"hf.last_hidden_state", "hf.hidden_states.0", "hf.hidden_states.1", "loss", "vec", "cube"}
    assert report.passed, report.summary()
    assert {"input.x", "input.scale"} <= {d.name for d in report.gradients}
    loss = next(d for d in report.outputs if d.name == "loss")
    assert loss.result.reference_shape == ()


def _nan_backend(gm, example_inputs):
    def run(*args):
        outs = gm.forward(*args)
        first = outs[0].clone()
        first.view(-1)[1] = float("nan")
        first.view(-1)[2] = float("inf")
        return [first, *outs[1:]]

    return run


def test_nan_and_inf_are_reported_explicitly(tiny):
    model, inputs = tiny
    report = KernelDiffHarness(model, inputs, test_backend=_nan_backend, runs=1, minify_on_failure=False).compare()
    assert not report.passed
    d = report.outputs[0]
    assert d.result.nan_count_alt == 1 and d.result.inf_count_alt == 1 and d.result.nan_count_ref == 0
    assert report.nonfinite == [{"name": "output", "kind": "output", "nan_reference": 0, "nan_test": 1,
                                 "inf_reference": 0, "inf_test": 1}]
    assert "NaN ref/test 0/1" in report.summary()
    data = json.loads(report.to_json())  # strict JSON despite non-finite values
    assert data["outputs"][0]["nan_count_test"] == 1


def _noisy_backend(gm, example_inputs):
    def run(*args):
        outs = gm.forward(*args)
        return [outs[0] + 1e-3 * torch.randn_like(outs[0]), *outs[1:]]

    return run


def test_repeated_runs_show_nondeterminism_with_mean_and_spread(tiny):
    model, inputs = tiny
    report = KernelDiffHarness(model, inputs, test_backend=_noisy_backend, runs=4, minify_on_failure=False).compare()
    d = report.outputs[0]
    assert len(d.run_max_abs_errors) == 4 and d.error_std > 0 and d.error_mean > 0
    assert "output" in report.nondeterminism["test"] and not report.nondeterminism["reference"]
    assert "nondeterminism: test" in report.summary()


class ShapesNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h.sum(0), h, h.reshape(2, 2, 1, 8)


@pytest.mark.slow
def test_visualizations_unique_per_run_and_recorded(tmp_path):
    torch.manual_seed(0)
    model, x = ShapesNet(), torch.randn(4, 8)
    runs = []
    for _ in range(2):
        rep = KernelDiffHarness(model, (x,), model_name="shapes", test_backend=perturbing_backend("fc"),
                                compare_modules=True, runs=1, artifact_root=tmp_path,
                                minify_on_failure=False).compare(generate_visualizations=True)
        runs.append(rep)
    a, b = (set(r.visualizations) for r in runs)
    assert a and not (a & b)
    names = {p.rsplit("/", 1)[-1] for p in a}
    rid = runs[0].run_id
    assert all(n.startswith(f"kd_{rid}_") for n in names)
    assert {f"kd_{rid}_summary.png", f"kd_{rid}_modules.png", f"kd_{rid}_heatmap_output_0.png",
            f"kd_{rid}_heatmap_output_1.png", f"kd_{rid}_heatmap_output_2.png", f"kd_{rid}_heatmap_module_fc.png"} <= names
    manifest = json.loads((tmp_path / rid / "manifest.json").read_text())
    kinds = {f["path"]: f["kind"] for f in manifest["files"]}
    assert kinds["reports/kerneldiff.json"] == "kerneldiff_report"
    assert sum(k == "kerneldiff_plot" for k in kinds.values()) == len(a)
    saved = json.loads((tmp_path / rid / "reports" / "kerneldiff.json").read_text())
    assert saved["schema"] == "debug_module.kerneldiff/1" and saved["first_divergent_module"] == "fc"
    out = runs[0].save_json(tmp_path / "copy.json")
    assert json.loads(out.read_text())["run_id"] == rid


def test_heatmap_nd_slices_through_worst_element(tmp_path):
    ref = torch.zeros(3, 4, 5)
    test = ref.clone()
    test[2, 1, 3] = 1.0
    assert error_heatmap(ref, test, "t", tmp_path / "h.png") == tmp_path / "h.png"
    assert (tmp_path / "h.png").read_bytes().startswith(b"\x89PNG")
    assert error_heatmap(torch.tensor(1.0), torch.tensor(2.0), "s", tmp_path / "s.png") is None
