"""Fixtures of the judgement suite: tiny Llama, Qwen2 and BERT models with small activations (one
per family and seed, built once per test session) and the engine on a fresh database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the bug cases and tiny models live in `benchmarks` (bench_diagnosis uses them too)
    sys.path.insert(0, str(ROOT))

from debug_framework.services.validation_engine import ValidationEngine  # noqa: E402

from benchmarks.models.tiny_transformers import make_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """``tiny_models(family, seed) -> path``: built on first use, kept for the session."""
    built: dict[tuple[str, int], Path] = {}

    def get(family: str, seed: int = 0) -> Path:
        if (family, seed) not in built:
            built[(family, seed)] = make_model(family, tmp_path_factory.mktemp(f"{family}{seed}") / "hf", seed)
        return built[(family, seed)]

    return get


@pytest.fixture
def engine(tmp_path) -> ValidationEngine:
    return ValidationEngine(tmp_path / "debug.db")
