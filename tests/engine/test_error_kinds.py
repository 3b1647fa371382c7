"""A backend failing mid-run is a BackendRuntimeError (DF005) naming the backend and the call, told
from the user's bad input (ConfigurationError) by its class; the session keeps the failure."""

from __future__ import annotations

import json

import pytest

from debug_framework.backends import register_backend, unregister_backend, user_backend
from debug_framework.errors import BackendRuntimeError, ConfigurationError
from debug_framework.services.validation_engine import ValidationEngine

CONFIG = {"isolate": False, "input_shape": [1, 8]}


class ListRunner:
    """A user backend whose run() returns a list, not a mapping of checkpoints."""

    def __init__(self, model, dtype, device):
        pass

    def run(self, inputs, keys):
        return [1, 2, 3]


@pytest.fixture
def list_backend():
    register_backend("returns_a_list", user_backend("returns_a_list", ListRunner, dtypes=("float32",)), replace=True)
    yield "returns_a_list"
    unregister_backend("returns_a_list")


def test_a_backend_returning_garbage_mid_run_is_a_backend_runtime_error(tiny_llama, db_path, list_backend):
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, CONFIG, "python_reference", list_backend)
    with pytest.raises(BackendRuntimeError, match="returned list, not a mapping of checkpoints") as e:
        engine.run(sid)
    assert not isinstance(e.value, ConfigurationError)
    assert (e.value.code, e.value.backend, e.value.call) == ("DF005", list_backend, "run")
    row = engine.db.sessions.get(sid)
    assert row["status"] == "error" and "returned list" in row["error_message"]


def test_the_cli_reports_it_as_exit_2_naming_the_backend(tiny_llama, tmp_path, list_backend, capsys):
    from debug_framework.cli.debug_validate import run

    code = run(["--model-path", str(tiny_llama), "--alternative-backend", list_backend, "--no-isolate",
                "--checkpoints", "post_mlp", "--database", str(tmp_path / "a.db"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["error"]["code"] == "DF005" and doc["error"]["error"] == "BackendRuntimeError"
    assert doc["error"]["context"] == {"backend": list_backend, "call": "run"}
