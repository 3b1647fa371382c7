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


def make_sessions(base: Path) -> Sessions:
    """A passing float32 session, a failing bfloat16 one (an explicit tolerance far below the
    rounding, tensors recorded for the heatmap) and one of a model at a hostile path."""
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
    engine.db.close()
    return Sessions(base / "db" / "debug.db", model, passed, failed, bad)


@pytest.fixture(scope="module")
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
    """The app run once on ``page`` (a file under pages/, None: the default page)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=timeout)
    if page is not None:
        at.switch_page(f"pages/{page}")
    for k, v in (query or {}).items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
