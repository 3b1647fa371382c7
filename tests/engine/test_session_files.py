"""What a session names on disk: a session id never leaves the inputs directory (DF005 at every
layer), and the model path is stored resolved, so listing, filtering and the report's reproduce
command work from any directory."""

from __future__ import annotations

import json
import uuid

import pytest

from debug_framework.cli.session_report import main as session_report
from debug_framework.errors import ValidationError
from debug_framework.services.validation_engine import ValidationEngine

CONFIG = {"input_shape": [1, 8], "isolate": False}


def test_a_session_id_never_leaves_the_inputs_directory(tmp_path):
    engine = ValidationEngine(tmp_path / "a" / "b" / "debug.db")
    for bad in ("../../x", "a/b", "x\0y", "..", "/abs", "x" * 129):
        with pytest.raises(ValidationError) as info:
            engine.db.sessions.create("m", "python_reference", "pytorch", session_id=bad)
        assert info.value.code == "DF005"
    assert engine.list_sessions() == []
    outside = tmp_path / "x.safetensors"  # a foreign row pointing out of the inputs directory
    outside.write_bytes(b"precious")
    sid = engine.db.sessions.create("m", "python_reference", "pytorch", session_id=f"s-{uuid.uuid4().hex}",
                                   inputs_ref=str(engine.inputs_dir / ".." / ".." / "x.safetensors"))
    assert engine.cleanup_session(sid, delete_records=True)
    assert outside.read_bytes() == b"precious" and engine.db.sessions.get(sid) is None


def test_the_model_path_is_stored_resolved(tiny_llama, tmp_path, monkeypatch, capsys):
    db = tmp_path / "debug.db"
    monkeypatch.chdir(tiny_llama.parent)
    engine = ValidationEngine(db)
    sid = engine.create_session(f"./{tiny_llama.name}", CONFIG, "python_reference", "pytorch")
    stored = engine.db.sessions.get(sid)["model_path"]
    assert stored == str(tiny_llama.resolve())
    assert [s["session_id"] for s in engine.list_sessions(model_path=f"./{tiny_llama.name}")] == [sid]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert [s["session_id"] for s in engine.list_sessions(model_path=str(tiny_llama))] == [sid]
    assert engine.list_sessions(model_path=f"./{tiny_llama.name}") == []  # relative to here: another model
    assert session_report(["--list", "--json", "--database", str(db), "--model-path", str(tiny_llama)]) == 0
    assert [it["session_id"] for it in json.loads(capsys.readouterr().out)] == [sid]
    assert session_report(["--session-id", sid, "--database", str(db)]) == 0
    command = json.loads(capsys.readouterr().out)["reproduce_command"]["command"]
    assert f"--model-path {tiny_llama.resolve()}" in command
