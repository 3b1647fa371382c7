"""What a backend can do is one typed record (``backends.capabilities``), read by the services and
never probed there: derived from a backend's methods, or declared by the backend itself, and then
what the stages do follows the declaration."""

from __future__ import annotations

import ast
from pathlib import Path

from debug_framework.backends import get_backend, register_backend, unregister_backend
from debug_framework.backends.capabilities import Capabilities, Support, capabilities, release
from debug_framework.backends.pytorch import PyTorchBackend
from debug_framework.modelio import load_model
from debug_framework.services.validation_engine import ValidationEngine

SERVICES = Path(__file__).resolve().parents[2] / "src" / "debug_framework" / "services"


def test_the_built_in_backends_records(tiny_llama):
    model = load_model(tiny_llama)
    ref, alt = get_backend("python_reference"), get_backend("pytorch")
    ref.prepare(model, "float64")
    alt.prepare(model.fork(), "float32", "cpu")
    r, a = capabilities(ref), capabilities(alt)
    assert r.reads_weights_only and r.weights_memory == "streams_weights" and r.default_dtype == "float64"
    assert not a.reads_weights_only and a.weights_memory == "resident"
    assert a.layer_replay.ok and a.block_replay.ok and a.decode.ok and a.decode_layer_replay.ok
    assert not a.graph_sessions.ok and "ONNX" in a.graph_sessions.why
    release(a, "replays")  # nothing held: nothing to do, no error


class _NoIsolation(PyTorchBackend):
    """Eager transformers that declares it cannot replay a layer (its runtime could not, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "declares_no_replay"

    def capabilities(self) -> Capabilities:
        from debug_framework.backends.capabilities import derive_capabilities

        return derive_capabilities(self).with_(layer_replay=Support(False, "replays are not offered by this engine"))


def test_a_declared_record_is_what_the_stages_follow(tiny_llama, tmp_path):
    register_backend("declares_no_replay", _NoIsolation, replace=True)
    try:
        engine = ValidationEngine(tmp_path / "d.db")
        result = engine.run(engine.create_session(tiny_llama, {"isolate": "auto"}, "python_reference",
                                                  "declares_no_replay"))
    finally:
        unregister_backend("declares_no_replay")
    assert result.verdict == "passed" and not result.isolation
    assert "replays are not offered by this engine" in result.isolation_note


_ABILITIES = {"run_layer", "run_block", "run_decode", "run_decode_layer", "can_decode", "can_run_layer",
              "can_run_block", "release_replays", "release_session", "open_session", "open_session_file",
              "supported_dtypes", "default_dtype", "streams_weights", "streams_layers", "version_info", "_graph",
              "run_layer_traced", "can_run_layer_traced", "export_layer", "model", "device"}


def test_no_service_probes_a_backend():
    """The services (validation, drill-down, ...) read abilities from the record: no getattr/hasattr
    of an ability name anywhere in services/."""
    found = []
    for path in SERVICES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in _ABILITIES \
                    and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
                found.append(f"{path.name}:{node.lineno} {node.args[1].value}")
    assert found == []
