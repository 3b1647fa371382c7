"""Fixtures of the integration tests: a tiny random BERT and a real session of an injected bug on it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the tiny models and injected bugs live in `benchmarks`
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def bug_check(tmp_path_factory):
    """A tiny random BERT on disk and a real session of the GELU bug on it, run in this process
    first: pytester's in-process runs remove the modules first imported inside them afterwards (and
    numba cannot be imported twice), so everything a session imports is imported here."""
    from benchmarks.injected_bugs import register_bug_backend
    from benchmarks.models.tiny_transformers import make_model
    from debug_framework.backends import unregister_backend
    from debug_framework.integrations.backend_check import run_backend_check

    tmp = tmp_path_factory.mktemp("bert")
    model = make_model("bert", tmp / "hf", 0)
    name = register_bug_backend("gelu_variant")
    try:
        outcome = run_backend_check(model, name, database=tmp / "db.db", report_dir=tmp / "reports", dtype="float32",
                                    drill_down=True)
    finally:
        unregister_backend(name)
    return model, outcome


@pytest.fixture(scope="session")
def tiny_bert(bug_check) -> Path:
    return bug_check[0]


