"""A session's backend files live with the session: an ``onnxruntime`` session exports into
``<db dir>/<db name>_artifacts/<session id>/onnxruntime/``, records the export's path and log in its
backend info, leaves nothing in the system temp directory and nothing on the terminal, replays its
layers from that one export (isolation adds no file), and ``cleanup_session(delete_records=True)``
removes the directory with the session."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

from debug_framework.services.validation_engine import ValidationEngine

_spec = importlib.util.spec_from_file_location("_engine_fixtures", Path(__file__).with_name("conftest.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)  # tests are not a package: make_tiny loaded by path

pytestmark = pytest.mark.slow  # one real export of a 2-layer model (seconds)


def test_an_onnxruntime_session_keeps_and_records_its_export(tmp_path, monkeypatch, capfd):
    pytest.importorskip("onnxruntime")
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))  # the system temp dir, as this test sees it
    model = _fixtures.make_tiny("llama", tmp_path / "model", num_hidden_layers=2)
    engine = ValidationEngine(tmp_path / "db" / "debug.db")
    sid = engine.create_session(model, {"isolate": True, "input_shape": [2, 8]}, "pytorch", "onnxruntime")
    capfd.readouterr()
    result = engine.run(sid)
    out, err = capfd.readouterr()
    assert out == err == "", (out, err)  # the exporter's ~30 warning lines went to the log
    assert result.verdict == "passed" and [iso.layer for iso in result.isolation] == [0, 1]

    root = engine.session_artifact_dir(sid)
    assert root == tmp_path / "db" / "debug_artifacts" / sid
    versions = engine.get_session_results(sid)["session"]["alternative_backend_info"]["versions"]
    onnx_path = Path(versions["onnx_path"])
    assert onnx_path.parent == root / "onnxruntime" and onnx_path.is_file()
    assert versions["artifact_dir"] == str(root / "onnxruntime") and versions["layer_replay"] == "graph"
    assert "== export of" in Path(versions["export_log"]).read_text()
    # isolation replayed both layers from the model's export: no per-layer file was written
    assert sorted(p.name for p in onnx_path.parent.iterdir()) == sorted(
        ["export.log", onnx_path.name, f"{onnx_path.name}.data"])
    assert not list(system_tmp.glob("df-onnx-*"))  # nothing of ours left in the temp dir

    assert engine.cleanup_session(sid, delete_records=True) and not root.exists()
