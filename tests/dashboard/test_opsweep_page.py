"""The Plugins page's view of backend conformance sweeps (stored rows, no sweep run here)."""

from __future__ import annotations

import pytest

from .conftest import HOSTILE, run_page

from debug_framework.conformance import OpResult

pytest.importorskip("streamlit")


def test_plugins_page_lists_conformance_sweeps_and_failing_operators(tmp_path, monkeypatch):
    from debug_framework.dashboard.settings import DATABASE_VARIABLE
    from debug_framework.storage.database import Database

    db_path = tmp_path / "sweeps.db"
    db = Database(db_path)
    db.opsweeps.start("mine-1", HOSTILE, "cpu", {"dtypes": ["float32"]})
    db.opsweeps.put("mine-1", OpResult("add", "pass", 1.0).to_dict())
    db.opsweeps.put("mine-1", OpResult("cumsum", "fail", 0.0, f"RMSE {HOSTILE}", repro="/r/repro.py").to_dict())
    db.close()
    monkeypatch.setenv(DATABASE_VARIABLE, str(db_path))
    at = run_page("plugins.py")
    frame = at.dataframe[0].value
    assert list(frame["operator"]) == ["cumsum"] and frame.iloc[0]["verdict"] == "fail"
    assert frame.iloc[0]["repro"] == "/r/repro.py" and "<U+202E>" in frame.iloc[0]["reason"]
    label = at.expander[0].label
    assert "1 passed, 1 failing" in label and "\u202e" not in label
