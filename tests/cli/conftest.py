"""A real artifacts root for CLI tests: an aot_mock_backend run (Inductor, constraints in warn mode) with a
guard report, and a failing KernelDiff run (a backend that perturbs one submodule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from debug_module.schemas import load_schema, validate

REPO = Path(__file__).resolve().parents[2]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def perturb_fc2(gm, example_inputs):
    last = None
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack") or {}
        if n.op == "call_function" and stack and list(stack.values())[-1][0].endswith("fc2"):
            last = n
    with gm.graph.inserting_after(last):
        new = gm.graph.call_function(torch.add, (last, 0.1))
    last.replace_all_uses_with(new)
    new.args = (last, 0.1)
    gm.recompile()
    return gm.forward


@pytest.fixture(scope="session")
def artifacts_root(tmp_path_factory):
    import debug_module as dm
    from debug_module.constraints import ShapeConstraint
    from debug_module.diff import KernelDiffHarness
    from debug_module.reports import save_guard_report

    root = tmp_path_factory.mktemp("artifacts")
    from debug_framework._torch import dynamo

    dynamo.reset()
    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 12)
    backend = dm.aot_mock_backend(strict=False, constraints=[ShapeConstraint(alignment=8)], artifact_root=root)
    inspector = dm.GuardInspector(model, backend=backend)
    inspector(x).sum().backward()
    save_guard_report(inspector.report(), backend.run_dir)
    dynamo.reset()
    kd = KernelDiffHarness(model, (x,), model_name="net", test_backend=perturb_fc2, compare_modules=True, runs=1,
                           artifact_root=root, minify_on_failure=False).compare(generate_visualizations=True)
    dynamo.reset()
    return {"root": root, "aot_run": backend.run_dir.name, "kd_run": kd.run_id}


def same_graph(gm, example_inputs):
    """A torch.compile backend that runs the captured graph unchanged: KernelDiff finds an exact match."""
    return gm.forward


@pytest.fixture(scope="session")
def report_root(artifacts_root, tmp_path_factory):
    """A copy of ``artifacts_root`` plus a second aot_mock_backend run (violations from two runs) and
    an exact-match KernelDiff run with plots asked for: the inductor-debug report's harder cases."""
    import shutil

    import debug_module as dm
    from debug_module.constraints import ShapeConstraint
    from debug_module.diff import KernelDiffHarness

    root = tmp_path_factory.mktemp("report_root") / "art"
    shutil.copytree(artifacts_root["root"], root)
    from debug_framework._torch import dynamo

    dynamo.reset()
    torch.manual_seed(1)
    model, x = Net(), torch.randn(3, 12)
    backend = dm.aot_mock_backend(strict=False, constraints=[ShapeConstraint(alignment=8)], artifact_root=root)
    torch.compile(model, backend=backend)(x)
    dynamo.reset()
    kd = KernelDiffHarness(model, (x,), model_name="net-exact", test_backend=same_graph, compare_modules=True,
                           runs=1, artifact_root=root, minify_on_failure=False).compare(generate_visualizations=True)
    dynamo.reset()
    return {**artifacts_root, "root": root, "aot_run2": backend.run_dir.name, "exact_run": kd.run_id, "exact": kd}


def run_cli(*args: str, input: str | None = None, script: bool = False, cwd: Path | None = None) -> tuple[int, str, str]:
    """Run the CLI in a fresh process (``python -m debug_module`` or the ``inductor-debug`` script)."""
    exe = [str(Path(sys.executable).parent / "inductor-debug")] if script else [sys.executable, "-m", "debug_module"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), COLUMNS="200")
    p = subprocess.run(exe + list(args), capture_output=True, text=True, input=input, env=env, cwd=cwd, timeout=300)
    return p.returncode, p.stdout, p.stderr


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``inductor-debug ARGS`` in this process (no torch import to wait for): the exit code, stdout
    and stderr. A CLI feature's own process boundary is tested with :func:`run_cli`."""
    from debug_module.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    cap = capsys.readouterr()
    return int(exit_info.value.code), cap.out, cap.err


def check_json(stdout: str) -> dict:
    doc = json.loads(stdout)
    errors = validate(doc, load_schema("cli-output"))
    assert not errors, errors
    return doc
