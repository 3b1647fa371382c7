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
    from debug_framework.backends.onnxruntime.runner import OnnxRuntimeBackend

    ok, why = decode_support(OnnxRuntimeBackend())
    assert not ok and "no past key/values" in why


@pytest.mark.slow  # two sessions with isolation and a drill-down (its culprit's repro verified in a subprocess)
def test_the_layer_is_replayed_and_drilled_at_the_decode_step_where_the_backend_can(tiny_models, engine):
    """Isolation at the step: a module backend's layer replayed at decode step 1 on the reference's
    input (over its own cache) confirms the RoPE bug there, and the layer after it, failing at that
    step too, is replayed there and only carries the error in; an engine without run_decode_layer
    leaves the source unconfirmed, saying why. The drill-down runs at that step too: the RoPE bug's
    layer, drilled in its decode-step computation, names the rotary operators the bug computes at
    position 0; the engine has no strategy, said so."""
    sources, drills, isolated = {}, {}, {}
    for bug in ("rope_wrong_position", "kv_write_off_by_one"):
        name = register_decode_bug(bug)
        try:
            cfg = {**BASE, "decode_steps": 2, "isolate": "auto", "drill_down": True}
            result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "python_reference", name))
        finally:
            unregister_backend(name)
        assert all(r.passed for r in result.results if r.step == 0)  # the prefill passes
        assert (str(result.first_divergence.key), result.first_divergence.step) == DECODE_BUGS[bug].expected
        sources[bug] = result.error_source
        drills[bug] = result.summary()["drilldown"]
        isolated[bug] = result.summary()["decode"].get("isolation")
    rope, write = sources["rope_wrong_position"], sources["kv_write_off_by_one"]
    assert (rope["kind"], rope["step"], rope["layer"], rope["confirmed"]) == ("decode", 1, 1, True)
    assert "introduced there" in rope["detail"]
    assert (write["kind"], write["step"], write["confirmed"]) == ("decode", 1, False)
    assert "cannot replay a layer at a decode step" in write["detail"]
    # every layer failing at the step replayed there: the bug's layer introduces, the one after carries
    assert isolated["kv_write_off_by_one"] is None
    iso = isolated["rope_wrong_position"]
    assert iso["step"] == 1 and [(r["layer"], r["introduces"]) for r in iso["layers"]] == [(1, True), (2, False)]
    [drill] = drills["rope_wrong_position"]
    assert (drill["layer"], drill["step"], drill["checkpoint"], drill["method"]) == (1, 1, "post_attention:1", "replay")
    culprit = drill["culprit"]
    assert culprit["op"] in ("aten.cos.default", "aten.sin.default", "aten.mul.Tensor") and culprit["verified"]
    assert culprit["module_path"] == "model.layers.1.self_attn" and culprit["source"].startswith("modeling_llama.py")
    assert "only the alternative has" in drill["note"]  # the position embeddings the hook computes anew
    assert drill["graph_file"].endswith("layer_1_step_1/layer_graph.json")
    [none] = drills["kv_write_off_by_one"]
    # the paged NumPy engine names its values (the trace drill-down), but of one forward pass only
    assert (none["layer"], none["step"], none["method"], none["operators"]) == (1, 1, "trace", [])
    assert "cannot run layer 1 at decode step 1" in none["note"]


def _writes_over_the_previous_slot(net):
    """A framework's cache write off by one while decoding: layer 1's cache entry writes a new
    token's key and value over the previous slot and again at its own (the overwritten token is
    lost); the prefill writes right."""
    import torch

    attn = net.model.layers[1].self_attn

    def pre(_module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and cache.get_seq_length(attn.layer_idx) > 0:
            entry = cache.layers[attn.layer_idx]

            def update(k, v, *_args, **_kwargs):
                entry.keys = torch.cat([entry.keys[:, :, :-1], k, k], dim=-2)
                entry.values = torch.cat([entry.values[:, :, :-1], v, v], dim=-2)
                return entry.keys, entry.values

            entry.update = update
        return args, kwargs

    def post(_module, _args, kwargs, _out):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            vars(cache.layers[attn.layer_idx]).pop("update", None)

    attn.register_forward_pre_hook(pre, with_kwargs=True)
    attn.register_forward_hook(post, with_kwargs=True)


@pytest.mark.slow  # two drill-downs, one with its culprit's repro verified in a subprocess
def test_the_drill_down_at_a_decode_step_names_the_cache_write(tiny_models, patched_backend, tmp_path):
    """The replay drill-down of layer 1 at decode step 1, given the reference's input to it at that
    step and the reference's past keys and values: the cache's update is part of the traced graph,
    so the concatenation that writes over the previous slot is named, at this file's line; the same
    layer drilled at the prefill has no culprit (the bug is decode-only)."""
    import numpy as np

    from debug_framework.backends import get_backend
    from debug_framework.capture.keys import CheckpointKey
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.modelio.loader import load_model
    from debug_framework.services.drilldown import DrillRequest, LayerDrilldown
    from debug_framework.services.drilldown.replay import ReplayStrategy

    model = load_model(str(tiny_models("llama", 0)))
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=6, seed=0, pad_lengths=[0, 2])
    ref = get_backend("python_reference")
    ref.prepare(model, "float64", "cpu")
    run = ref.run_decode(inputs, 1, [CheckpointKey("post_mlp", 0)], np.array([[5], [7]]))
    alt = get_backend(patched_backend("decode_bug_cache_write", _writes_over_the_previous_slot))
    alt.prepare(model, "float32", "cpu")
    strategy = ReplayStrategy()

    def drill(step, hidden, past=None):
        return strategy.drill(DrillRequest(layer=1, checkpoint="post_attention:1", backend=alt, model=model,
                                           inputs=inputs, hidden_in=np.asarray(hidden, np.float64), dtype="float32",
                                           device="cpu", out_dir=tmp_path / f"step_{step}", step=step,
                                           tokens=run.tokens, past=past))

    at_step = drill(1, run.captures[1][CheckpointKey("post_mlp", 0)], run.kv_cache[0][1])
    assert at_step.step == 1 and at_step.culprit is not None
    assert (at_step.culprit.op, at_step.culprit.module_path) == ("aten.cat.default", "model.layers.1.self_attn")
    assert at_step.culprit.source.startswith("test_decode_bugs.py:")
    assert "differs from the reference's by keys RMS" in at_step.note  # the past, measured as carried in
    assert LayerDrilldown.from_dict(at_step.to_dict()).step == 1
    prefill = drill(0, ref.run(inputs, capture_layer_inputs=True).layer_inputs[1])
    assert prefill.step == 0 and prefill.culprit is None and prefill.operators


def test_the_isolation_at_a_decode_step_reads_as_one_line():
    """The terminal's and the HTML report's line for ``decode["isolation"]``; none without it."""
    from debug_framework.reports._decode import step_isolation_text
    from debug_framework.services.validation.results import ValidationResult

    def typed(doc: dict) -> ValidationResult:
        return ValidationResult.from_dict(doc)

    iso = {"step": 2, "layers": [{"layer": 1, "introduces": True}, {"layer": 3, "introduces": False},
                                 {"layer": 4, "introduces": False}]}
    assert step_isolation_text(typed({"decode": {"isolation": iso}})) == [
        "isolation at decode step 2: layer(s) 1 introduce error there; layer(s) 3, 4 only carry it in"]
    assert step_isolation_text(typed({"decode": {"steps": 2}})) == [] == step_isolation_text(typed({}))
