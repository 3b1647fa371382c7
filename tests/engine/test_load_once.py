"""One ``debug_validate`` run loads the model once and builds each backend once; a stored session
run again from the database (batch, resume) still loads and builds what it needs itself."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import debug_framework.backends as backends_pkg
import debug_framework.modelio as modelio
from debug_framework.backends import torch_reference
from debug_framework.cli.debug_validate import run
from debug_framework.services.validation_engine import ValidationEngine


@pytest.fixture
def counted(monkeypatch):
    """Counts ``load_model`` calls, ``get_backend`` builds by name and trusted-implementation builds."""
    counts: Counter[str] = Counter()
    real_load, real_get = modelio.load_model, backends_pkg.get_backend
    real_init = torch_reference.TorchReferenceBackend.__init__

    def load(*args, **kwargs):
        counts["load_model"] += 1
        return real_load(*args, **kwargs)

    def get(name, *args, **kwargs):
        counts[f"build {name}"] += 1
        return real_get(name, *args, **kwargs)

    def init(self, *args, **kwargs):
        counts["build torch_reference"] += 1
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(modelio, "load_model", load)
    monkeypatch.setattr(backends_pkg, "get_backend", get)
    monkeypatch.setattr(torch_reference.TorchReferenceBackend, "__init__", init)
    return counts


def test_one_cli_run_loads_the_model_once_and_builds_each_backend_once(tiny_llama, db_path, tmp_path, counted):
    out = tmp_path / "result.json"
    code = run(["--model-path", str(tiny_llama), "--alternative-backend", "pytorch", "--database", str(db_path),
                "--isolate", "--output-file", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["verdict"] == "passed"
    assert counted["load_model"] == 1, counted
    assert counted["build python_reference"] == 1 and counted["build pytorch"] == 1, counted
    assert counted["build torch_reference"] == 1, counted  # the calibration's trusted implementation


def test_a_stored_session_runs_from_the_database_alone(tiny_llama, db_path, counted):
    creator = ValidationEngine(db_path)
    sid = creator.create_session(tiny_llama, {"isolate": False}, "python_reference", "pytorch")
    counted.clear()
    result = ValidationEngine(db_path).run(sid)  # another engine (a batch worker, a resumed job)
    assert result.passed
    assert counted["load_model"] == 1 and counted["build pytorch"] == 1 and counted["build python_reference"] == 1


def test_one_run_resolves_the_plan_once_and_reads_no_inputs_back(tiny_llama, db_path, monkeypatch):
    """create_session validates the configuration, resolves the plan and builds the inputs; its
    run in the same process is handed all three: the plan is not resolved again, the saved inputs
    file (the session's record) is not read back, the configuration not validated again."""
    from debug_framework.models.session_config import SessionConfig
    from debug_framework.modelio import ModelInputs
    from debug_framework.services.validation.plan import ValidationPlan

    counts: Counter[str] = Counter()
    real_resolve, real_load, real_check = ValidationPlan.resolve.__func__, ModelInputs.load.__func__, \
        SessionConfig.from_mapping.__func__

    def resolve(cls, *args, **kwargs):
        counts["resolve"] += 1
        return real_resolve(cls, *args, **kwargs)

    def load(cls, *args, **kwargs):
        counts["inputs read"] += 1
        return real_load(cls, *args, **kwargs)

    def check(cls, *args, **kwargs):
        counts["validated"] += 1
        return real_check(cls, *args, **kwargs)

    monkeypatch.setattr(ValidationPlan, "resolve", classmethod(resolve))
    monkeypatch.setattr(ModelInputs, "load", classmethod(load))
    monkeypatch.setattr(SessionConfig, "from_mapping", classmethod(check))
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, {"isolate": True, "input_shape": [1, 8]}, "python_reference", "pytorch")
    assert counts == {"resolve": 1, "validated": 1}, counts
    result = engine.run(sid)
    assert result.passed and result.isolation
    assert counts == {"resolve": 1, "validated": 1}, counts  # nothing resolved, read or validated again
    stored = engine.db.sessions.get(sid)
    assert ModelInputs.load(stored["inputs_ref"]).input_ids.shape == (1, 8)  # still written, for the record

    counts.clear()
    assert engine.run(engine.create_session(
        tiny_llama, SessionConfig(isolate=False, input_shape=(1, 8)), "python_reference", "pytorch")).passed
    assert counts == {"resolve": 1}, counts  # a SessionConfig enters as it is: checked when it was built

    counts.clear()  # a session run from the database alone: its record read back, checked once
    sid = engine.create_session(tiny_llama, {"isolate": False, "input_shape": [1, 8]}, "python_reference", "pytorch")
    counts.clear()
    assert ValidationEngine(db_path).run(sid).passed
    assert counts == {"resolve": 1, "validated": 1, "inputs read": 1}, counts
