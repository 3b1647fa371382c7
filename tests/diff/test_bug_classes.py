"""Real classes of torch.compile wrong-result bugs, made deterministic by the backends of
``bug_backends.py``: the fair default judge (float64 ratio rule) lets precision-only differences pass
and fails each bug; one ``inductor-debug diff`` minifies the failure (forward or gradient) to a verified
repro whose folder is ``data.repro``; the oracle and the repro apply one rule to dtypes, shapes and
non-finite values, on fresh clones of the inputs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from debug_framework.comparison import compare
from debug_framework.measure import TimedBackend
from debug_module.diff import KernelDiffHarness
from debug_module.minifier import AccuracySignature, _runtime
from debug_module.minifier.graph import record_values
from debug_module.reports._kerneldiff import exact_match_of

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"kd_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


bb, bm = _load("bug_backends"), _load("bug_models")


# ------------------------------------------------------------------ one rule (fast)


_NAN, _INF = math.nan, math.inf
_PAIRS = [  # (reference, alternative): NaN vs finite, matching and opposite infinities, plain values
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
    ([1.0, 0.0, 3.0], [1.0, _NAN, 3.0]),
    ([1.0, _NAN, 3.0], [1.0, 0.0, 3.0]),
    ([1.0, _NAN, 3.0], [1.0, _NAN, 3.0]),
    ([_INF, 2.0, -_INF], [_INF, 2.0, -_INF]),
    ([_INF, 2.0, 3.0], [-_INF, 2.0, 3.0]),
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.001]),
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0 + 1e-7]),
]


@pytest.mark.parametrize("ref,alt", _PAIRS)
def test_the_repro_rule_is_the_comparison_core_rule(ref, alt):
    """The rule the minifier's oracle and repro.py share (``_runtime.compare_outputs``) gives the comparison
    core's verdict (equal_nan, dtype checked) on NaN, infinities and values alike."""
    r, a = torch.tensor(ref), torch.tensor(alt)
    (row,) = _runtime.compare_outputs([r], [a], 1e-4, 1e-5)
    assert row["passed"] == compare(r, a, rtol=1e-4, atol=1e-5, equal_nan=True).passed, row
    assert row["passed"] == (row["failure"] is None)


def test_dtype_and_shape_failures_are_named():
    a = torch.tensor([1, 2, 3], dtype=torch.int8)
    (row,) = _runtime.compare_outputs([a], [a.to(torch.int64)], 0.0, 0.0)
    assert not row["passed"] and row["failure"] == "dtype" and "int8" in row["reason"]
    assert not compare(a, a.to(torch.int64)).passed  # the core agrees (check_dtype)
    (row,) = _runtime.ratio_outputs([a.double()], [a], [a.to(torch.int64)], 2.0, 1e-5)
    assert row["failure"] == "dtype"
    (row,) = _runtime.compare_outputs([a], [a[:2]], 0.0, 0.0)
    assert row["failure"] == "shape"
    sig = {"kind": "accuracy", "failures": ["dtype"]}
    assert _runtime.matches(sig, {"kind": "accuracy", "outputs": [{"passed": False, "failure": "dtype"}]})
    assert not _runtime.matches(sig, {"kind": "accuracy", "outputs": [{"passed": False, "failure": "value"}]})


def test_exact_match_is_never_true_on_a_dtype_mismatch():
    entry = {"name": "out", "passed": False, "max_abs_error": 0.0, "comparison": {"reference_dtype": "int8",
                                                                                    "alternative_dtype": "int64"}}
    assert not exact_match_of({"outputs": [entry]})
    assert not exact_match_of({"outputs": [{**entry, "passed": True}]})  # even if a judge had let it pass
    same = {**entry, "passed": True, "comparison": {"reference_dtype": "int8", "alternative_dtype": "int8"}}
    assert exact_match_of({"outputs": [same]})


# ------------------------------------------------------------------ fresh inputs (fast)


def _sin_then_scale(x):
    x.sin_()
    return x * 3.0


def test_every_oracle_run_gets_fresh_inputs():
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 3)
    original = x.clone()
    gm = make_fx(_sin_then_scale)(x.clone())
    timed = TimedBackend(lambda g, i: g, keep_graphs=True)
    timed(gm, [x])
    x.sin_()  # the graph has run: the input changed, what was kept did not
    torch.testing.assert_close(timed.graphs[0][1][0], original, rtol=0, atol=0)

    values = record_values(gm, [original])
    assert torch.equal(values[next(n.name for n in gm.graph.nodes if n.op == "placeholder")], original)
    sig = AccuracySignature(lambda g, i: g, reference="eager", rtol=0.0, atol=0.0)
    first, second = sig.observe(gm, [original]), sig.observe(gm, [original])
    assert first == second and all(r["passed"] for r in first["outputs"]), first  # sin_ applied once per run
    assert torch.equal(values[next(n.name for n in gm.graph.nodes if n.op == "placeholder")], original)


# ------------------------------------------------------------------ fair by default


@pytest.mark.slow
@pytest.mark.parametrize("name", bm.PRECISION_CASES)
def test_precision_only_differences_pass_at_defaults(name):
    """A compiler that keeps intermediates in float64 differs from eager by rounding only: the default
    judge (float64 ratio rule) passes it; the tiny-variance norm fails eager's fixed tolerance."""
    model, inputs = getattr(bm, name)()
    report = KernelDiffHarness(model, inputs, test_backend=bb.more_precise, runs=1, minify_on_failure=False).compare()
    assert report.passed and report.reference_backend == "float64" and report.mode == "float64-ratio", report.summary()
    if name == "tiny_variance_norm":
        fixed = KernelDiffHarness(model, inputs, test_backend=bb.more_precise, runs=1, minify_on_failure=False,
                                  rtol=1.3e-6, atol=1e-5).compare()
        assert not fixed.passed and fixed.reference_backend == "eager"  # a tolerance given: eager + tolerance


@pytest.mark.slow
def test_a_dtype_only_bug_fails_and_is_no_exact_match():
    model, inputs = bm.dtype()
    report = KernelDiffHarness(model, inputs, test_backend=bb.int8_add_widened, runs=1,
                               minify_on_failure=False).compare()
    (bad,) = report.failed
    assert "dtype mismatch: eager int8 vs test int64" in bad.reason and bad.max_abs_error == 0
    assert not report.passed and not report.exact_match and not report.to_dict()["exact_match"]


# ------------------------------------------------------------------ one command (slow: compiles and fresh processes)


def _fresh_run(repro_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, str(repro_dir / "repro.py")], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _doc_command() -> list[str]:
    """The one-command example of docs/kerneldiff.md, as arguments of ``inductor-debug``."""
    import re
    import shlex

    (block,) = re.findall(r"<!-- one-command -->\s*```bash\n(.*?)```", (HERE.parents[1] / "docs" / "kerneldiff.md")
                          .read_text(), re.S)
    command = block.replace("\\\n", " ").splitlines()[0].split(">")[0]
    argv = shlex.split(command)
    assert argv[0] == "inductor-debug"
    return argv[1:]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(bm.CASES))
def test_each_class_is_judged_by_its_failure_and_reduced_to_its_op(case):
    """What the one command does, without the fresh-process verification (each costs a cold torch start):
    KernelDiff fails the bug at defaults, the signature is narrowed to the bug's class of failure, and
    the minifier reduces the failing graph (the AOT backward graph for the gradient bug) to the bad op."""
    from debug_module.diff import _minify
    from debug_module.minifier import Minifier

    backend, gradients, failure, op = bm.CASES[case]
    model, inputs = getattr(bm, case)()
    harness = KernelDiffHarness(model, inputs, test_backend=getattr(bb, backend), compare_gradients=gradients, runs=1,
                                minify_on_failure=False)
    report = harness.compare()
    assert not report.passed and report.forward_passed == gradients, report.summary()
    failing = next(d for d in (report.gradients if gradients else report.outputs) if not d.passed)
    sig = _minify._signature(harness, harness._test_side, failing)
    gm, graph_inputs = harness._test_side.timed.graphs[0]
    (graph, args), *_ = _minify._backward_graphs(gm, graph_inputs, 0) if gradients else [(gm, graph_inputs)]
    holds, observation = sig.check(graph, args)
    assert holds, observation
    sig = sig.for_failure(observation)
    assert sig.failures == [failure]
    result = Minifier(graph, args, sig, progress=False, verify=False).minify()
    assert result.nodes == 1 and op in result.ops[0], result.summary()


@pytest.mark.slow
# a cold torch start per verification: the CI runs the docs' (gradient) case; the other classes are
# reduced above and verified in fresh processes by `benchmarks/bench_minifier.py --bug-classes`
@pytest.mark.parametrize("case", ["gradient"])
def test_one_command_from_a_failing_diff_to_a_verified_repro(case, tmp_path, capsys, monkeypatch):
    from debug_module.cli import main

    backend, gradients, failure, op = bm.CASES[case]
    if case == "gradient":  # the docs' example, as written
        monkeypatch.chdir(HERE.parents[1])
        args = _doc_command()
        args[args.index("--root") + 1] = str(tmp_path / "art")
    else:
        args = ["--root", str(tmp_path / "art"), "--json", "diff", "--model", f"{HERE / 'bug_models.py'}:{case}",
                "--backend", f"{HERE / 'bug_backends.py'}:{backend}", "--runs", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    code = exit_info.value.code
    doc = json.loads(capsys.readouterr().out)
    from debug_module.schemas import load_schema, validate

    schema = load_schema("cli-output")
    assert not validate(doc, schema)
    assert not validate({**doc, "data": {**doc["data"], "repro": None, "minifier": None}}, schema)  # a passing diff
    data = doc["data"]
    assert code == 1 and data["passed"] is False and data["reference"] == "float64", data
    m = data["minifier"]
    assert m["status"] == "ran" and m["verified"] is True, m
    assert m["stage"] == ("backward" if gradients else "forward") and m["failures"] == [failure], m
    assert m["nodes"] == 1 and op in m["detail"], m
    repro = Path(data["repro"])
    assert repro.is_dir() and repro.is_relative_to(Path(data["path"])), data
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    p = _fresh_run(repro, cwd)  # torch alone, from another directory, no PYTHONPATH
    assert p.returncode == 1 and p.stdout.rstrip().splitlines()[-1].startswith("REPRO: reproduced: "), p.stdout + p.stderr


# ------------------------------------------------------------------ cache-proof (fast)


@pytest.mark.slow
def test_compiles_are_judged_with_the_compile_caches_off():
    """The compiled side of KernelDiff and every oracle compile run with Inductor's FX graph cache off,
    whatever the process's setting: a verdict never comes from a cached artifact."""
    from debug_framework._torch import inductor

    seen: list[bool] = []

    def recording(gm, example_inputs):
        seen.append(inductor.config_flags()["fx_graph_cache"])
        return gm.forward

    def f(x):
        return torch.relu(x) * 2.0

    x = torch.randn(8)
    report = KernelDiffHarness(f, (x,), test_backend=recording, runs=1, minify_on_failure=False).compare()
    assert report.passed and seen == [False], seen
    from torch.fx.experimental.proxy_tensor import make_fx

    AccuracySignature(recording, reference="float64", rtol=0.0, atol=0.0).observe(make_fx(f)(x), [x])
    assert seen == [False, False]
