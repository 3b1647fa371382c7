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


@pytest.fixture
def patched_backend():
    """``make(name, patch) -> name``: eager transformers with ``patch(net)`` applied to the built
    module, registered as a module backend for the test (and unregistered after it)."""
    from debug_framework.backends import module_backend, register_backend, unregister_backend
    from debug_framework.backends.pytorch import build_hf_model

    names: list[str] = []

    def make(name: str, patch) -> str:
        def build(model, dtype, device):
            net = build_hf_model(model, dtype, device)
            patch(net)
            return net

        register_backend(name, module_backend(name, build), replace=True)
        names.append(name)
        return name

    yield make
    for n in names:
        unregister_backend(n)


@pytest.fixture
def engines():
    """``make(name, cls) -> name``: the engine class ``cls`` (prefill/decode_step/kv_cache) registered
    as a float32 user backend for the test (and unregistered after it)."""
    from debug_framework.backends import register_backend, unregister_backend, user_backend

    names: list[str] = []

    def make(name: str, cls: type) -> str:
        register_backend(name, user_backend(name, cls, dtypes=("float32",)), replace=True)
        names.append(name)
        return name

    yield make
    for n in names:
        unregister_backend(n)
