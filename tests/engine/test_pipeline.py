"""The engine is a loop over stages: a new stage is one class, the loop alone reports progress and
times stages, every row is written once (a failing stage keeps the rows measured before it)."""

from __future__ import annotations

import pytest

from debug_framework.errors import ValidationError
from debug_framework.services.database_manager import DatabaseManager
from debug_framework.services.validation.plan import ValidationPlan
from debug_framework.services.validation.stages import DEFAULT_STAGES, RunContext, Stage, StoreStage
from debug_framework.services.validation_engine import ValidationEngine

CONFIG = {"isolate": False, "input_shape": [1, 8]}


class NameModules(Stage):
    """A custom stage adds a measurement (each layer checkpoint's module path); it decides nothing."""

    name = "name modules"
    timing_key = "modules_s"

    def run(self, ctx: RunContext) -> None:
        for ev in ctx.evidence.checkpoints:
            if ev.key.layer is not None:
                ev.module = f"model.layers.{ev.key.layer}"


class Explode(Stage):
    name = "explode"

    def run(self, ctx: RunContext) -> None:
        raise RuntimeError("a stage crashed")


def _with(extra: Stage) -> list[Stage]:
    stages = list(DEFAULT_STAGES)
    stages.insert(stages.index(next(s for s in stages if isinstance(s, StoreStage))), extra)
    return stages


def test_a_custom_stage_is_one_class(tiny_llama, db_path):
    engine = ValidationEngine(db_path, stages=_with(NameModules()))
    sid = engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")
    seen: list[tuple[str, int, int]] = []
    result = engine.run(sid, progress=lambda *a: seen.append(a))
    names = [s for s, _, _ in seen]
    assert names == ["load", "prepare", "reference", "alternative", "calibration", "compare", "noise rule",
                     "precision", "name modules", "store"]
    assert [d for _, d, _ in seen] == list(range(1, len(names) + 1)) and {t for *_, t in seen} == {len(names)}
    assert result.verdict == "passed" and result.results[3].module == "model.layers.1"
    assert result.performance["modules_s"] >= 0.0 and "comparison_s" in result.performance
    rows = DatabaseManager(db_path).get_checkpoint_results(sid)
    named = [r for r in rows if r["id"] == "post_mlp:5"]
    assert named and named[0]["module"] == "model.layers.5" and named[0]["passed"]  # its measurement kept


def test_a_crashing_stage_is_a_bug_it_keeps_rows_and_marks_the_session(tiny_llama, db_path):
    engine = ValidationEngine(db_path, stages=_with(Explode()))
    sid = engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")
    with pytest.raises(RuntimeError, match="a stage crashed"):  # our bug: not dressed up as DF005
        engine.run(sid)
    stored = engine.get_session_results(sid)
    assert stored["status"] == "error" and "internal error" in stored["error_message"]
    assert "RuntimeError: a stage crashed" in stored["error_message"]
    assert len(stored["checkpoints"]) == 14  # written after compare, before the crash


def test_a_backend_failing_mid_run_is_df005_naming_it(tiny_llama, db_path, monkeypatch):
    from debug_framework.backends.pytorch import PyTorchBackend

    def broken_run(self, *args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(PyTorchBackend, "run", broken_run)
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")
    with pytest.raises(ValidationError, match=r"backend 'pytorch' failed in run\(\): RuntimeError: device lost") as e:
        engine.run(sid)
    assert e.value.code == "DF005" and e.value.context["backend"] == "pytorch"
    assert engine.get_session_results(sid)["status"] == "error"


def test_isolation_that_cannot_run_is_not_timed_or_persisted(tiny_llama, db_path):
    from debug_framework.backends import register_backend, unregister_backend, user_backend
    from debug_framework.backends.python_reference import PythonReferenceBackend

    class NoReplay:  # a user backend without run_layer: isolation "auto" has nothing to do
        def __init__(self, model, dtype, device):
            self.ref = PythonReferenceBackend()
            self.ref.prepare(model, "float32")

        def run(self, inputs, keys):
            return dict(self.ref.run(inputs, keys).tensors)

    register_backend("no_replay", user_backend("no_replay", NoReplay, dtypes=("float32",)), replace=True)
    try:
        engine = ValidationEngine(db_path)
        sid = engine.create_session(tiny_llama, {**CONFIG, "isolate": "auto"}, "python_reference", "no_replay")
        seen: list[str] = []
        result = engine.run(sid, progress=lambda stage, done, total: seen.append(stage))
    finally:
        unregister_backend("no_replay")
    assert "isolation" in seen and result.isolation is None and "isolation_s" not in result.performance
    assert "no run_layer" in (result.isolation_note or "")


@pytest.mark.parametrize("bad", ["../../escape", "a/b", "", ".hidden", "x" * 200])
def test_a_chosen_session_id_must_be_a_plain_name(tiny_llama, db_path, bad):
    engine = ValidationEngine(db_path)
    with pytest.raises(ValidationError, match="not a plain name"):
        engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch", session_id=bad)
    assert engine.list_sessions() == [] and not list(db_path.parent.rglob("*escape*"))


def test_stages_without_a_store_are_an_error(tiny_llama, db_path):
    engine = ValidationEngine(db_path, stages=[s for s in DEFAULT_STAGES if not isinstance(s, StoreStage)])
    sid = engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")
    with pytest.raises(ValidationError, match="no result"):
        engine.run(sid)


def test_the_plan_resolves_keys_dtypes_and_tolerances():
    plan = ValidationPlan.resolve({"dtype": "float16", "reference_dtype": "float64", "layers": [1, 3],
                                   "enabled_checkpoints": ["post_mlp", "post_processing"],
                                   "precision_thresholds": {"post_mlp:2": {"atol": 0.5}}}, num_layers=6)
    assert [str(k) for k in plan.keys] == ["post_mlp:1", "post_mlp:2", "post_processing"]
    assert plan.governing_dtype == "float16" and list(plan.layer_range) == [1, 2]
    k1, k2 = plan.keys[0], plan.keys[1]
    assert plan.tolerance(k1).atol == 1e-2 and plan.tolerance(k2).atol == 0.5
    with pytest.raises(ValidationError, match="unknown session configuration key"):
        ValidationPlan.resolve({"isolat": True}, num_layers=6)
