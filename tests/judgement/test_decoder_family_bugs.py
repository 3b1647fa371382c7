"""The newer decoder families (Mistral, Qwen3, Phi-3, Gemma 2, Gemma 3 text, Qwen3-MoE) judged by
their from-the-math references: a correct eager PyTorch run passes in float32, and one injected bug
per family is localized to its layer and block (every bug of every family, on five seeds, in
benchmarks/bench_diagnosis.py)."""

from __future__ import annotations

import pytest

from .test_injected_bugs import _check_located

#: one bug per family: a wrong attention scale, a dropped q/k norm, a swapped expert, a missing
#: soft-cap, a missing ``(1 + w)``, a sliding window one too wide.
ONE_BUG = [("swapped_expert", "qwen3_moe"), ("missing_attention_softcap", "gemma2"), ("dropped_q_norm", "qwen3")]
ONE_BUG_SLOW = [("norm_without_offset", "gemma3_text"), ("attention_scale", "phi3"),
                ("sliding_window_off_by_one", "mistral")]


@pytest.mark.parametrize("family", ["mistral", "qwen3", "phi3", "gemma2", "gemma3_text", "qwen3_moe"])
def test_reference_vs_pytorch_float32(family, tiny_models, engine):
    result = engine.run(engine.create_session(tiny_models(family, 0), {"dtype": "float32", "seed": 0, "isolate": False},
                                              "python_reference", "pytorch"))
    assert result.passed, (family, result.first_divergence and str(result.first_divergence.key))
    assert all(o.judged_by == "calibration" and 0 <= o.margin <= 1 for o in result.results)


@pytest.mark.parametrize(("bug", "family"), ONE_BUG)
def test_one_bug_per_family_is_located(bug, family, tiny_models, engine, bug_backend):
    _check_located(engine, tiny_models(family, 0), bug, bug_backend(bug), "float32", 0)


@pytest.mark.slow
@pytest.mark.parametrize(("bug", "family"), ONE_BUG_SLOW)
def test_one_bug_per_family_is_located_slow(bug, family, tiny_models, engine, bug_backend):
    _check_located(engine, tiny_models(family, 0), bug, bug_backend(bug), "float32", 0)
