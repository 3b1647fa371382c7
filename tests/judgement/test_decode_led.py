"""A greedy decode led by the alternative (services/validation/decode_led.py): the reference, in a
process of its own, is fed the alternative's tokens several a pass and says after each pass what it
would feed next; while it agrees, the session is the session the reference leads; at a flip the
steps judged stand and the reference leads from the step after it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_framework.backends import get_backend
from debug_framework.backends.decode import CHUNK_STEPS
from debug_framework.capture.keys import all_checkpoints
from debug_framework.modelio.inputs import ModelInputs
from debug_framework.modelio.loader import load_model
from debug_framework.services.validation.decode_ahead import ahead_support, token_pipe
from debug_framework.services.validation.decode_led import ChosenTokens
from debug_framework.services.validation.decode_stage import DecodeStage

STEPS = 2 * CHUNK_STEPS + 3
CONFIG = {"decode_steps": STEPS, "isolate": False, "precision_diagnosis": False, "input_shape": [2, 5]}
needs_two = pytest.mark.skipif(not ahead_support(True, STEPS, "cpu")[0],
                               reason=f"no child process here: {ahead_support(True, STEPS, 'cpu')[1]}")


def test_fed_tokens_wait_for_a_pass_and_end_where_the_sender_closes():
    feed, writer = token_pipe(2)
    for t in range(3):
        assert feed.send(writer, np.array([t, 10 + t]))
    writer.close()  # the session's process stops feeding
    assert feed.known(0, 8).tolist() == [[0, 1, 2], [10, 11, 12]]  # fewer than asked: the feed ended
    assert feed.known(1, 1).tolist() == [[1], [11]]
    with pytest.raises(EOFError, match="decode step 4"):
        feed.known(3, 1)
    feed.close()
    assert not feed.send(writer, np.array([0, 0]))  # a closed end: nothing sent, no error


def test_a_fed_reference_computes_several_steps_a_pass_and_says_its_own_choice(tiny_models):
    model = load_model(str(tiny_models("llama", 0)))
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=6, seed=3, pad_lengths=[0, 2])
    backend = get_backend("float64_eager")
    backend.prepare(model, "float64", "cpu")
    keys = all_checkpoints(model.num_layers, model.router_layers)
    greedy = list(backend.iter_decode(inputs, STEPS, keys, None, None))
    tokens = np.stack([p.token for p in greedy[1:]], axis=1)
    chosen = ChosenTokens(tokens.copy())
    chosen.count = STEPS
    fed = list(backend.iter_decode(inputs, STEPS, keys, chosen, None))
    plain = list(backend.iter_decode(inputs, STEPS, keys, tokens.copy(), None))
    assert [p.step for p in fed] == list(range(STEPS + 1))
    assert sum(1 for p in fed[1:] if p.capture.meta["chunk"][0] == p.step) == -(-STEPS // CHUNK_STEPS)
    for p in fed[:-1]:  # the reference's own choice after each pass is the token fed next (its greedy decode's)
        assert p.capture.meta["choice"] == tokens[:, p.step].tolist(), p.step
    for a, b in zip(fed, plain):
        assert np.array_equal(a.mask, b.mask) and a.span == b.span and "choice" not in b.capture.meta
        for k in b.capture.tensors:
            torch.testing.assert_close(a.capture[k], b.capture[k], rtol=1e-12, atol=1e-12 * float(b.capture[k].abs().max()))


def _decode(result):
    d = result.summary()["decode"]
    return d, [(r["step"], r["top1_agreement"], r["calibration"]) for r in d["token_metrics"]], \
        [(r["step"], r["layer"], r["compared"]) for r in d["kv_cache"]], [r["k"]["rmse"] for r in d["kv_cache"]]


@needs_two
def test_a_session_the_alternative_leads_is_the_session_the_reference_leads(tiny_models, engine, monkeypatch):
    path = tiny_models("llama")
    led = engine.run(engine.create_session(path, CONFIG, "float64_eager", "pytorch"))
    monkeypatch.setattr(DecodeStage, "_may_lead", staticmethod(lambda *a: False))
    ref = engine.run(engine.create_session(path, CONFIG, "float64_eager", "pytorch"))
    (d1, t1, kv1, r1), (d2, t2, kv2, r2) = _decode(led), _decode(ref)
    assert d1["led_by"] == {"alternative_led_through_step": STEPS, "reference_led_from_step": None}
    assert d2["led_by"] is None and led.passed and ref.passed
    assert d1["tokens"] == d2["tokens"] and t1 == t2 and kv1 == kv2
    assert np.allclose(r1, r2, rtol=1e-6, atol=0)
    assert d1["reference_chunks"]["computed"] == STEPS  # no step computed in vain: no draft to refuse
    assert d1["reference_process"]["calibration_passes"] == len(d1["calibration_noise"]["sampled_steps"])


FLIP_AT = 5


def _flips_at_step(net) -> None:
    """The LM head's logits at decode step FLIP_AT pushed to token 7 (a bug the alternative's own
    greedy choice follows)."""
    seen = {"step": 0}

    def hook(module, args, out):
        if out.shape[1] > 1:  # a prefill: a decode starts
            seen["step"] = 0
            return out
        seen["step"] += 1
        if seen["step"] == FLIP_AT:
            out = out.clone()
            out[..., 7] += 1e4
        return out
    net.lm_head.register_forward_hook(hook)


@needs_two
def test_at_a_flip_the_reference_leads_from_the_step_after_it(tiny_models, engine, monkeypatch, patched_backend):
    name = patched_backend("flips_at_5", _flips_at_step)
    path = tiny_models("llama")
    led = engine.run(engine.create_session(path, CONFIG, "float64_eager", name))
    monkeypatch.setattr(DecodeStage, "_may_lead", staticmethod(lambda *a: False))
    ref = engine.run(engine.create_session(path, CONFIG, "float64_eager", name))
    (d1, t1, kv1, _), (d2, t2, kv2, _) = _decode(led), _decode(ref)
    assert d1["led_by"] == {"alternative_led_through_step": FLIP_AT, "reference_led_from_step": FLIP_AT + 1}
    assert not led.passed and d1["first_failed_step"] == d2["first_failed_step"] == FLIP_AT
    assert [row[FLIP_AT] for row in d1["tokens"]] != [7, 7]  # the reference's choice, not the alternative's
    assert d1["tokens"] == d2["tokens"] and t1 == t2 and kv1 == kv2 and len(t1) == STEPS + 1


@needs_two
def test_the_calibrations_noise_by_its_decode_judges_as_by_its_prefills(tiny_models, engine, monkeypatch):
    """The calibration's noise measured by its own decode in the reference's process (fed the
    tokens several a pass) is of the size of the noise measured by one prefill a sampled step, at
    the same steps, and judges the session alike: the same tokens, verdicts and sampled steps."""
    from debug_framework.services.validation import decode_calibration

    path = tiny_models("llama")
    decoded = engine.run(engine.create_session(path, CONFIG, "float64_eager", "pytorch"))
    monkeypatch.setattr(decode_calibration, "streams_decode", lambda backend: False)
    prefilled = engine.run(engine.create_session(path, CONFIG, "float64_eager", "pytorch"))
    d1, d2 = decoded.summary()["decode"], prefilled.summary()["decode"]
    n1, n2 = d1["calibration_noise"], d2["calibration_noise"]
    assert {p["how"] for p in n1["passes"]} == {"decode"} and {p["how"] for p in n2["passes"]} == {"prefill"}
    assert [p["step"] for p in n1["passes"]] == [p["step"] for p in n2["passes"]] == [0, *n1["sampled_steps"]]
    assert decoded.passed and prefilled.passed and d1["tokens"] == d2["tokens"]
    assert d1["reference_process"]["calibration_passes"] == len(n1["sampled_steps"])
    pairs = [(a[part]["noise_rmse"], b[part]["noise_rmse"]) for a, b in zip(d1["kv_cache"], d2["kv_cache"])
             for part in ("k", "v") if a["step"] in n1["sampled_steps"]]
    assert pairs and all((a > 0) == (b > 0) for a, b in pairs)
    # rounding noise either way: the same size (a misplaced position would be orders of magnitude off)
    assert all(b / 10 <= a <= 10 * b for a, b in pairs if a > 0 and b > 0)
