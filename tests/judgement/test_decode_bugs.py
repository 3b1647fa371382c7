"""Decode through the references written from the math (python_reference, and torch_reference as
the calibration): a correct framework passes every decode step, and each decode-only bug of
``benchmarks.decode_bugs`` is found at its step and layer with the prefill passing (the sweep over
seeds is ``benchmarks/bench_decode_diagnosis.py``)."""

from __future__ import annotations

import pytest

from benchmarks.decode_bugs import DECODE_BUGS, register_decode_bug
from debug_framework.backends import unregister_backend

BASE = {"decode_steps": 3, "isolate": False, "precision_diagnosis": False, "input_shape": [2, 6],
        "pad_lengths": [0, 2]}


def test_the_reference_decodes_a_sliding_window_model_in_bfloat16(tiny_models, engine):
    """Mistral's window (4) is shorter than the prompt and the steps: the reference keeps every key
    and masks those out of the window, transformers' cache evicts them; the KV rows compare the
    positions both hold. Left padding from an offset: the rows decode at their own positions."""
    cfg = {**BASE, "decode_steps": 5, "dtype": "bfloat16", "padding_side": "left", "position_offset": 3}
    result = engine.run(engine.create_session(tiny_models("mistral", 0), cfg, "python_reference", "pytorch"))
    assert result.passed, result.first_divergence
    assert sorted({r.step for r in result.results}) == list(range(6))
    assert all(r.judged_by == "calibration" for r in result.results)  # torch_reference decoded in bfloat16
    kv = result.summary()["decode"]["kv_cache"]
    assert {(r["step"], r["layer"]) for r in kv} == {(s, i) for s in range(6) for i in range(3)}
    assert all(r["passed"] and r["k"]["shape_match"] for r in kv)


@pytest.mark.parametrize("bug", sorted(set(DECODE_BUGS) - {"rope_wrong_position"}))  # that one: the replay test
def test_a_decode_only_bug_is_found_at_its_step_and_layer(tiny_models, engine, bug):
    spec = DECODE_BUGS[bug]
    name = register_decode_bug(bug)
    try:
        result = engine.run(engine.create_session(tiny_models(spec.family, 0), {**BASE, **spec.config},
                                                  "python_reference", name))
    finally:
        unregister_backend(name)
    assert not result.passed
    assert all(r.passed for r in result.results if r.step == 0)  # the prefill passes
    first, source = result.first_divergence, result.error_source
    assert (str(first.key), first.step) == spec.expected
    assert (source["kind"], source["layer"]) == (spec.source, first.key.layer)


def test_onnxruntime_says_why_it_cannot_decode():
    """Its export takes the whole sequence: the decode stage refuses it with this reason (DF002,
    as it refuses BERT in test_decode.py)."""
    from debug_framework.backends.decode import decode_support
    from debug_framework.backends.onnx_runtime import OnnxRuntimeBackend

    ok, why = decode_support(OnnxRuntimeBackend())
    assert not ok and "no past key/values" in why


def test_the_layer_is_replayed_at_the_decode_step_where_the_backend_can(tiny_models, engine):
    """Isolation at the step: a module backend's layer replayed at decode step 1 on the reference's
    input (over its own cache) confirms the RoPE bug there; an engine without run_decode_layer
    leaves the source unconfirmed, saying why."""
    sources = {}
    for bug in ("rope_wrong_position", "kv_write_off_by_one"):
        name = register_decode_bug(bug)
        try:
            cfg = {**BASE, "decode_steps": 2, "isolate": "auto"}
            result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "python_reference", name))
        finally:
            unregister_backend(name)
        assert all(r.passed for r in result.results if r.step == 0)  # the prefill passes
        assert (str(result.first_divergence.key), result.first_divergence.step) == DECODE_BUGS[bug].expected
        sources[bug] = result.error_source
    rope, write = sources["rope_wrong_position"], sources["kv_write_off_by_one"]
    assert (rope["kind"], rope["step"], rope["layer"], rope["confirmed"]) == ("decode", 1, 1, True)
    assert "introduced there" in rope["detail"]
    assert (write["kind"], write["step"], write["confirmed"]) == ("decode", 1, False)
    assert "cannot replay a layer at a decode step" in write["detail"]
