"""The engine protocol (prefill, decode_step, kv_cache) with the example engine of our own:
examples/paged_kv_engine.py, a NumPy Llama that packs the batch and keeps its KV cache in pages,
validated through decode steps against the model's own code in float64."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from debug_framework.backends import register_backend, unregister_backend, user_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_kv_engine import PagedLlamaEngine  # noqa: E402

from benchmarks.decode_bugs import OffByOneWrite  # noqa: E402
from benchmarks.injected_bugs import BUG_LAYER  # noqa: E402


@pytest.fixture
def engines():
    names = []

    def make(name, cls):
        register_backend(name, user_backend(name, cls, dtypes=("float32",)), replace=True)
        names.append(name)
        return name

    yield make
    for n in names:
        unregister_backend(n)


CFG = {"decode_steps": 3, "isolate": False, "precision_diagnosis": False, "input_shape": [3, 8],
       "pad_lengths": [0, 3, 5]}


def test_the_paged_engine_passes_every_step_and_its_cache_matches(tiny_models, engine, engines):
    """Left padding (the off-by-one test below pads on the right)."""
    result = engine.run(engine.create_session(tiny_models("llama", 0), {**CFG, "padding_side": "left"}, "float64_eager",
                                              engines("paged_numpy", PagedLlamaEngine)))
    assert result.passed, result.first_divergence
    assert sorted({r.step for r in result.results}) == [0, 1, 2, 3]
    kv = result.summary()["decode"]["kv_cache"]
    assert {r["step"] for r in kv} == {0, 1, 2, 3} and all(r[p]["shape_match"] for r in kv for p in "kv")
    assert all(r["passed"] for r in kv)  # every layer's cache after every pass within a correct run's bound


def test_a_kv_cache_write_off_by_one_is_found_at_decode(tiny_models, engine, engines):
    result = engine.run(engine.create_session(tiny_models("llama", 0), CFG, "float64_eager",
                                              engines("paged_off_by_one", OffByOneWrite)))
    assert not result.passed and all(r.passed for r in result.results if r.step == 0)
    first = result.first_divergence
    assert first.step >= 1 and str(first.key) == f"post_attention:{BUG_LAYER}"
