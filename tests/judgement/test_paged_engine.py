"""The engine protocol (prefill, decode_step, kv_cache) with the example engine of our own:
examples/paged_kv_engine.py, a NumPy Llama that packs the batch and keeps its KV cache in pages,
validated through decode steps against the model's own code in float64."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_kv_engine import PagedLlamaEngine  # noqa: E402

from benchmarks.decode_bugs import OffByOneWrite  # noqa: E402
from benchmarks.injected_bugs import BUG_LAYER  # noqa: E402

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


class InterleavedRotary(PagedLlamaEngine):
    """GPT-J's rotary convention (pairs of neighbouring features) where Llama rotates halves."""

    def _rotate(self, x, positions):
        import numpy as np

        from debug_framework.architectures.llama import rope_cos_sin

        cos, sin = rope_cos_sin(positions, self.net.inv_freq, np.dtype(np.float32))
        half = x.shape[-1] // 2
        c, s = cos[:, None, :half], sin[:, None, :half]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = even * c - odd * s, even * s + odd * c
        return out


def test_the_numpy_engine_gets_isolation_and_the_drill_down_by_named_values(tiny_models, engine, engines):
    """A user's NumPy engine, outside the package, declares layer replay (run_layer) and named
    intermediate values (run_layer_traced): isolation replays its layers, and the drill-down names
    the step that introduces the error, here the rotary embedding of the queries, in every layer."""
    from debug_framework.backends import get_backend
    from debug_framework.backends.capabilities import capabilities
    from debug_framework.modelio import load_model

    model = tiny_models("llama", 0)
    correct = engine.run(engine.create_session(model, {"isolate": True, "input_shape": [2, 8], "pad_lengths": [0, 3]},
                                               "python_reference", engines("paged_ok", PagedLlamaEngine)))
    assert correct.passed and len(correct.isolation) == load_model(model).num_layers
    assert correct.introducing_layers == []
    name = engines("paged_gptj_rope", InterleavedRotary)
    result = engine.run(engine.create_session(model, {"isolate": True, "drill_down": True, "input_shape": [2, 8],
                                                      "pad_lengths": [0, 3]}, "python_reference", name))
    assert not result.passed and str(result.first_divergence.key) == "post_attention:0"
    assert result.introducing_layers and result.drilldown
    for entry in result.drilldown:
        assert entry.method == "trace" and entry.culprit is not None, entry.note
        assert entry.culprit.op == "q_rope", [(r.op, r.margin) for r in entry.operators]
        ops = [r.op for r in entry.operators]
        assert ops[:4] == ["attn_norm", "q", "k", "v"] and all(not r.introduces for r in entry.operators[:4])
    backend = get_backend(name)
    backend.prepare(load_model(model).fork(), "float32")
    caps = capabilities(backend)
    assert caps.layer_trace.ok and caps.layer_replay.ok and caps.decode.ok
