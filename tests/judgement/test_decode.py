"""Decode steps: the prefill, then tokens decoded one at a time through each backend's own KV cache,
teacher-forced with the reference's greedy tokens; every step's checkpoints judged, the first
divergence naming its step; a bug only in the decode path is found at a step >= 1."""

from __future__ import annotations

import numpy as np
import pytest

from debug_framework.errors import BackendInitializationError, ConfigurationError

from benchmarks.decode_bugs import kv_cache_in_bfloat16 as _kv_cache_in_bfloat16
from benchmarks.decode_bugs import rope_at_zero_while_decoding as _rope_at_zero_while_decoding
from benchmarks.injected_bugs import BUG_LAYER

#: the generic tier: float64_eager (the model's own code in float64) decodes through its cache
DECODE = {"model_tier": "generic", "decode_steps": 3, "isolate": False, "precision_diagnosis": False,
          "input_shape": [2, 8], "pad_lengths": [0, 3]}


@pytest.fixture
def decode_bug(patched_backend):
    """``make(patch) -> name``: a ``pytorch``-like module backend with a decode-only bug."""
    return lambda patch: patched_backend(f"decode_bug_{patch.__name__.strip('_')}", patch)


def test_a_correct_backend_passes_every_decode_step(tiny_models, engine):
    """Left-padded rows from position 5 decode at their own positions; the float64 reference stays
    finite (a fully masked padded row is no NaN: Float64Softmax)."""
    cfg = {**DECODE, "padding_side": "left", "position_offset": 5}
    result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert result.passed, result.first_divergence
    assert all(r.comparison.nan_count_ref == 0 for r in result.results)
    assert all(r.comparison.masked_positions == 3 for r in result.results if r.step == 0)
    steps = sorted({r.step for r in result.results})
    assert steps == [0, 1, 2, 3] and result.results[0].id.endswith("@0")
    assert all(r.judged_by == "calibration" for r in result.results)
    decode = result.summary()["decode"]
    assert decode["steps"] == 3 and np.asarray(decode["tokens"]).shape == (2, 3)
    assert {row["step"] for row in decode["kv_cache"]} == {0, 1, 2, 3}  # the cache after every pass, per layer
    assert all(row["passed"] and row["k"]["judged_by"] == "calibration" for row in decode["kv_cache"])


@pytest.mark.parametrize("patch,where", [(_rope_at_zero_while_decoding, f"post_attention:{BUG_LAYER}"),
                                         (_kv_cache_in_bfloat16, "post_attention:0")])
def test_a_decode_only_bug_is_found_at_its_step_and_layer(tiny_models, engine, decode_bug, patch, where):
    result = engine.run(engine.create_session(tiny_models("llama", 0), DECODE, "float64_eager", decode_bug(patch)))
    assert not result.passed
    assert all(r.passed for r in result.results if r.step == 0)  # the prefill passes
    first = result.first_divergence
    assert first.step == 1 and str(first.key) == where and first.id == f"{where}@1"
    ref = result.summary()["first_divergence"]
    assert (ref["step"], ref["checkpoint"], ref["layer"]) == (1, "post_attention", first.key.layer)
    source = result.error_source
    if patch is _kv_cache_in_bfloat16:  # the cache after the prefill already differs: it is named the source
        assert (source["kind"], source["step"], source["layer"]) == ("kv_cache", 0, 0)
        rows = [r for r in result.summary()["decode"]["kv_cache"] if r["step"] == 0]
        assert rows and not any(r["passed"] for r in rows)
    else:  # the cache the prefill wrote is right: the decode step itself goes wrong
        assert (source["kind"], source["step"], source["layer"]) == ("decode", 1, BUG_LAYER)
        assert all(r["passed"] for r in result.summary()["decode"]["kv_cache"] if r["step"] == 0)


def test_given_tokens_and_bad_decode_settings(tiny_models, engine):
    cfg = {**DECODE, "decode_steps": 2, "decode_tokens": [[1, 2], [3, 4]]}
    result = engine.run(engine.create_session(tiny_models("llama", 0), cfg, "float64_eager", "pytorch"))
    assert result.passed and result.summary()["decode"]["tokens"] == [[1, 2], [3, 4]]
    for bad in ({"decode_steps": -1}, {"decode_tokens": [[1]]}):
        with pytest.raises(ConfigurationError):
            engine.create_session(tiny_models("llama", 0), {**DECODE, "decode_steps": 0, **bad}, "float64_eager",
                                  "pytorch")
    with pytest.raises(ConfigurationError, match="decode_tokens"):  # refused before anything runs
        engine.create_session(tiny_models("llama", 0), {**DECODE, "decode_tokens": [[1, 2, 3]]}, "float64_eager",
                              "pytorch")
    with pytest.raises(ConfigurationError, match="max_position_embeddings"):
        engine.create_session(tiny_models("llama", 0), {**DECODE, "decode_steps": 10_000}, "float64_eager", "pytorch")
    no_decode = engine.create_session(tiny_models("bert", 0), {**DECODE, "model_tier": "auto"}, "python_reference",
                                      "pytorch")
    with pytest.raises(BackendInitializationError, match="encoder") as refused:  # DF002: what the backend cannot do
        engine.run(no_decode)
    assert refused.value.code == "DF002"


def test_debug_validate_decode_steps_json(tiny_models, decode_bug, tmp_path, capsys):
    """``debug_validate --decode-steps N --json``: the first divergence names its step, checkpoint
    and layer (exit 1); bad decode options exit 2."""
    import json

    from debug_framework.cli.debug_validate import run

    base = ["--model-path", str(tiny_models("llama", 0)), "--reference-backend", "float64_eager",
            "--database", str(tmp_path / "d.db"), "--no-isolate"]
    code = run([*base, "--alternative-backend", decode_bug(_rope_at_zero_while_decoding), "--decode-steps", "2",
                "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["decode"]["steps"] == 2
    first = out["first_divergence"]
    assert (first["step"], first["checkpoint"], first["layer"]) == (1, "post_attention", BUG_LAYER)
    assert run([*base, "--alternative-backend", "pytorch", "--decode-steps", "2", "--decode-tokens", "1,x"]) == 2
    assert run([*base, "--alternative-backend", "pytorch", "--decode-steps", "-1"]) == 2
