"""Fixtures of the dashboard tests: one database of real sessions made by the engine on a tiny random
Llama (built once per module that asks), the app's settings pointing at it, and AppTest runs."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the tiny models live in `benchmarks`
    sys.path.insert(0, str(ROOT))

APP = ROOT / "src" / "debug_framework" / "dashboard" / "app.py"
HOSTILE = "<script>alert(1)</script>[x](javascript:alert(2))_**bold**_\u202e"


@dataclass
class Sessions:
    database: Path
    model: Path
    passed: str
    failed: str
    hostile: str
    drilled: str


def make_sessions(base: Path) -> Sessions:
    """A passing float32 session, a failing bfloat16 one (an explicit tolerance far below the
    rounding, tensors recorded for the heatmap), one of a model at a hostile path, and a drilled one
    (an attention-scale bug in one layer, ``drill_down`` on)."""
    from benchmarks.injected_bugs import register_bug_backend
    from debug_framework.backends import unregister_backend
    from benchmarks.models.tiny_transformers import make_model
    from debug_framework.services.validation_engine import ValidationEngine

    model = make_model("llama", base / "model" / "hf", 0)
    hostile = base / "evil" / HOSTILE
    shutil.copytree(model, hostile)  # a copy: the engine stores a symlink's target
    engine = ValidationEngine(base / "db" / "debug.db")
    passed = engine.create_session(str(model), {"dtype": "float32"}, "python_reference", "pytorch")
    engine.run(passed)
    failed = engine.create_session(str(model), {"dtype": "bfloat16", "tensor_recording_enabled": True,
                                                "precision_thresholds": {"rtol": 0.0, "atol": 1e-9}},
                                   "python_reference", "pytorch")
    engine.run(failed)
    bad = engine.create_session(str(hostile), {"dtype": "float32"}, "python_reference", "pytorch")
    engine.run(bad)
    buggy = register_bug_backend("attention_scale")
    try:
        drilled = engine.create_session(str(model), {"dtype": "float32", "drill_down": True}, "python_reference", buggy)
        engine.run(drilled)
    finally:
        unregister_backend(buggy)
    engine.db.close()
    return Sessions(base / "db" / "debug.db", model, passed, failed, bad, drilled)


@pytest.fixture(scope="session")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Sessions:
    return make_sessions(tmp_path_factory.mktemp("dash"))


@pytest.fixture
def app_env(sessions: Sessions, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Sessions:
    """The app's settings pointing at the sessions' database (and an empty artifacts root)."""
    from debug_framework.dashboard.settings import ARTIFACTS_VARIABLE, DATABASE_VARIABLE

    monkeypatch.setenv(DATABASE_VARIABLE, str(sessions.database))
    monkeypatch.setenv(ARTIFACTS_VARIABLE, str(tmp_path / "artifacts"))
    monkeypatch.setenv("PIE_DEBUG_LOG_DIR", str(tmp_path / "logs"))
    return sessions


def run_page(page: str | None = None, query: dict[str, str] | None = None, timeout: float = 60):
    """The app run once on ``page`` (a file under views/, None: the default page)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=timeout)
    if page is not None:
        at.switch_page(f"views/{page}")
    for k, v in (query or {}).items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _perturb_fc2(gm, example_inputs):  # noqa: ANN001
    import torch

    """A test backend that adds 0.1 after fc2: KernelDiff's accuracy failure."""
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


def make_runs(root: Path) -> dict[str, str]:
    """Two real debug_module runs under ``root``: an aot_mock_backend run (Inductor, a shape
    constraint in warn mode) with a guard report, and a failing KernelDiff run with its plots."""
    import torch

    import debug_module as dm
    from debug_framework._torch import dynamo
    from debug_module.constraints import ShapeConstraint
    from debug_module.diff import KernelDiffHarness
    from debug_module.reports import save_guard_report

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(12, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    dynamo.reset()
    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 12)
    backend = dm.aot_mock_backend(strict=False, constraints=[ShapeConstraint(alignment=8)], artifact_root=root)
    inspector = dm.GuardInspector(model, backend=backend)
    inspector(x).sum().backward()
    save_guard_report(inspector.report(), backend.run_dir)
    dynamo.reset()
    kd = KernelDiffHarness(model, (x,), model_name="net", test_backend=_perturb_fc2, compare_modules=True, runs=1,
                           artifact_root=root, minify_on_failure=False).compare(generate_visualizations=True)
    dynamo.reset()
    return {"aot": backend.run_dir.name, "kd": kd.run_id}


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A debug_module artifacts root with two real runs (:func:`make_runs`)."""
    root = tmp_path_factory.mktemp("artifacts")
    return root, make_runs(root)
