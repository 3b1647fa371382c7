"""DF005 has three kinds, told apart by class: the user's bad input (``ConfigurationError``), a backend
failing mid-run (``BackendRuntimeError``, naming the backend and the call) and a validation that
cannot execute for another reason (``ValidationError`` itself). All are caught as ValidationError;
an output that cannot be written is ConfigurationError, or DF007 when there is no room."""

from __future__ import annotations

import errno
import json
import pickle
from pathlib import Path

import pytest

import debug_framework
from debug_framework import errors
from debug_framework.errors import (
    BackendRuntimeError,
    ConfigurationError,
    ResourceExhaustedError,
    ValidationError,
    unwritable_output,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cls", [ConfigurationError, BackendRuntimeError])
def test_the_kinds_are_df005_validation_errors_exported_with_the_others(cls):
    assert issubclass(cls, ValidationError) and cls.code == "DF005"
    assert cls.title != ValidationError.title and cls.default_hint != ValidationError.default_hint
    assert cls.__name__ in errors.__all__ and cls.__name__ in debug_framework.__all__
    assert getattr(debug_framework, cls.__name__) is cls
    assert f"`{cls.__name__}`" in (ROOT / "README.md").read_text()  # the README's error table
    assert cls.__name__ in errors.__doc__  # the tree in the module's docstring


def test_a_backend_runtime_error_names_the_backend_and_the_call_and_survives_pickling():
    cause = RuntimeError("device lost")
    exc = BackendRuntimeError.from_exception("mine", "run()", cause)
    assert (exc.backend, exc.call) == ("mine", "run()")
    assert exc.message == "backend 'mine' failed in run(): RuntimeError: device lost"
    assert exc.to_dict()["error"] == "BackendRuntimeError" and exc.to_dict()["context"] == {"backend": "mine",
                                                                                            "call": "run()"}
    back = pickle.loads(pickle.dumps(exc))  # a batch worker or a Ray task hands it back as it is
    assert type(back) is BackendRuntimeError and (back.backend, back.call) == ("mine", "run()")
    assert str(back) == str(exc) and back.to_dict() == exc.to_dict()
    plain = pickle.loads(pickle.dumps(ValidationError("x", session="s")))
    assert str(plain) == str(ValidationError("x", session="s"))  # not rendered twice


def test_an_unwritable_output_is_the_users_path_unless_there_is_no_room(tmp_path):
    denied = unwritable_output(OSError(errno.EACCES, "Permission denied"), "write the report",
                               hint="choose a writable --output-file", file="/r.json")
    assert type(denied) is ConfigurationError and denied.hint == "choose a writable --output-file"
    assert denied.message.startswith("cannot write the report") and denied.context == {"file": "/r.json"}
    full = unwritable_output(OSError(errno.ENOSPC, "No space left on device"), "write the report",
                             hint="choose a writable --output-file", file="/r.json")
    assert type(full) is ResourceExhaustedError and full.code == "DF007"


def test_bad_session_options_are_configuration_errors():
    from debug_framework.services.validation.plan import validate_session_config

    for bad in ({"isolat": True}, {"isolate": "maybe"}, {"layers": [3, 1]}, {"input_shape": [0, 4]}):
        with pytest.raises(ConfigurationError):
            validate_session_config(bad)


def test_a_bad_cli_option_exits_2_with_df005_as_a_configuration_error(tmp_path, capsys):
    from debug_framework.cli.debug_validate import run

    code = run(["--model-path", str(tmp_path), "--dtype", "float8", "--database", str(tmp_path / "a.db"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["exit_code"] == 2
    assert doc["error"]["code"] == "DF005" and doc["error"]["error"] == "ConfigurationError"
    assert "--dtype 'float8'" in doc["error"]["message"]


def test_an_unwritable_report_file_exits_2_as_a_configuration_error(tmp_path, capsys):
    from debug_framework.cli.session_report import main
    from debug_framework.storage.database import Database

    with Database(tmp_path / "d.db") as db:
        sid = db.sessions.create("/m", "python_reference", "pytorch")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["--session-id", sid, "--database", str(tmp_path / "d.db"), "--output-format", "json",
                 "--output-file", str(blocker / "r.json"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["error"]["code"] == "DF005" and doc["error"]["error"] == "ConfigurationError"
    assert doc["error"]["hint"] == "choose a writable --output-file"
