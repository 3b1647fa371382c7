"""Long decodes (issue 47): each step keeps and compares its new K/V entries only (its last
positions), the whole cache on audited steps and where the engine rewrote it; a KV bug that appears
only late is caught at its step."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from debug_framework.backends import get_backend, register_backend, unregister_backend, user_backend
from debug_framework.backends.decode import KV_AUDIT_EVERY, KV_TAIL
from debug_framework.capture.keys import CheckpointKey
from debug_framework.modelio.inputs import ModelInputs
from debug_framework.modelio.loader import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from paged_kv_engine import PagedLlamaEngine  # noqa: E402

from benchmarks.injected_bugs import BUG_LAYER  # noqa: E402

PROMPT = 8
#: the decode step from which the late bug writes a new key over the previous slot
LATE = 201


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    """The tests' tiny Llama with room for 512 positions (its RoPE does not depend on the limit)."""
    from benchmarks.models.tiny_transformers import make_model

    path = make_model("llama", tmp_path_factory.mktemp("long") / "hf", 0)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 512
    (path / "config.json").write_text(json.dumps(config))
    return path


class LateOffByOneWrite(PagedLlamaEngine):
    """A KV-cache write off by one from decode step :data:`LATE` on: layer ``BUG_LAYER`` writes
    the new token's key and value over the previous slot's, the new slot left as the pages held it."""

    def _write(self, layer: int, row: int, k: np.ndarray, v: np.ndarray) -> None:
        if layer == BUG_LAYER and k.shape[0] == 1 and self.lengths[row] >= PROMPT + LATE - 1:
            self.lengths[row] -= 1
            super()._write(layer, row, k, v)
            self.lengths[row] += 1
            super()._write(layer, row, k, v)
            return
        super()._write(layer, row, k, v)


def test_the_audits_read_a_bounded_number_of_positions_a_step_however_long_the_decode():
    """Every KV_AUDIT_EVERY-th step up to 511, then further apart as the cache grows (a quarter of the
    power of two below the step), and the last: the positions the audits read, over the steps taken,
    stay under eight a step at 100, 1000 and 20000 steps (an audit every 64 steps would read 313 a
    step at 20000)."""
    from debug_framework.backends.decode import kv_audited

    audited = [s for s in range(1, 3001) if kv_audited(s, 3000)]
    assert audited[:8] == [KV_AUDIT_EVERY * i for i in range(1, 9)]
    assert audited[8:12] == [640, 768, 896, 1024] and audited[-3:] == [2048, 2560, 3000]
    for steps in (100, 1000, 20000):
        read = sum(s for s in range(1, steps + 1) if kv_audited(s, steps))
        assert read / steps < 8 + 1, steps  # the last step's audit included


def test_a_step_keeps_its_new_entries_and_the_whole_cache_rebuilds(long_llama):
    """Between audits a pass keeps each layer's last KV_TAIL positions alone; the whole cache rebuilt from
    the last whole one and the new entries after it equals the next audit's (which keeps it whole)."""
    import torch

    steps = KV_AUDIT_EVERY + 6
    model = load_model(str(long_llama))
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=PROMPT, seed=0, pad_lengths=[0, 2])
    backend = get_backend("float64_eager")
    backend.prepare(model, "float64", "cpu")
    run = backend.run_decode(inputs, steps, [CheckpointKey("post_mlp", 0)])
    spans = [set(s.values()) for s in run.kv_span]
    assert spans[0] == {"prefill"} and spans[KV_AUDIT_EVERY] == spans[steps] == {"audit"}
    assert all(spans[s] == {"new"} for s in range(1, steps) if s != KV_AUDIT_EVERY)
    assert all(tuple(k.shape[1:2]) == (KV_TAIL,) for s in range(1, KV_AUDIT_EVERY) for k, _ in run.kv_cache[s].values())
    whole = run.kv_cache[steps]
    rebuilt = run.cache_at(steps - 1)
    for layer, (k, v) in whole.items():
        assert k.shape[1] == PROMPT + steps
        torch.testing.assert_close(rebuilt[layer][0], k[:, :-1], rtol=0, atol=0)
        torch.testing.assert_close(rebuilt[layer][1], v[:, :-1], rtol=0, atol=0)


def test_the_calibration_is_measured_at_powers_of_two_every_256th_and_the_last_step():
    from debug_framework.services.validation.decode_calibration import NOISE_EVERY, noise_sampled

    assert NOISE_EVERY == 256
    assert [s for s in range(1, 1001) if noise_sampled(s, 1000)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1000]
    assert not noise_sampled(LATE, 1000)  # the late bug below starts between two measured steps


@pytest.mark.slow  # 210 decode steps on two sides, the calibration's prefills where it is measured
def test_a_kv_bug_after_200_steps_is_caught_at_its_step(long_llama, engine):
    name = "paged_late_off_by_one"
    register_backend(name, user_backend(name, LateOffByOneWrite, dtypes=("float32",)), replace=True)
    try:
        cfg = {"decode_steps": LATE + 9, "isolate": False, "precision_diagnosis": False, "input_shape": [2, PROMPT]}
        result = engine.run(engine.create_session(long_llama, cfg, "float64_eager", name))
    finally:
        unregister_backend(name)
    assert not result.passed
    assert all(r.passed for r in result.results if r.step < LATE)  # every step before it passes
    first = result.first_divergence
    assert (first.step, str(first.key)) == (LATE, f"post_attention:{BUG_LAYER}")
    kv = result.summary()["decode"]["kv_cache"]
    at = {(r["step"], r["layer"]): r for r in kv}
    assert not at[(LATE, BUG_LAYER)]["passed"] and at[(LATE, BUG_LAYER)]["compared"] == "new entries"
    assert all(r["passed"] for r in kv if r["step"] < LATE)
    noise = result.summary()["decode"]["calibration_noise"]  # the bound carried between sampled steps
    assert LATE not in noise["sampled_steps"] and noise["carried"] > noise["measured"]
    assert noise["remeasured"] >= 1  # step LATE failed by the carried bound: its own noise judged it
    remeasured = [p for p in noise["passes"] if p["why"] == "failed by the carried bound"]
    assert remeasured[0]["step"] == LATE and remeasured[0]["tokens"] == PROMPT + LATE  # one prefill of its tokens
