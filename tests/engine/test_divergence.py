"""Injected bugs are found at the right checkpoint and layer; isolation names the layer that
introduces the error; correct backend pairs pass on several seeds."""

from __future__ import annotations

import pytest

from debug_framework.backends import registered_backends
from debug_framework.capture import CheckpointKey
from debug_framework.services.validation_engine import ValidationEngine

BUGS = {
    # bug -> (first divergence, layers that introduce error, where inside the layer)
    "rope": (CheckpointKey("post_attention", 0), [0, 1, 2, 3, 4, 5], "attention"),
    "causal_mask": (CheckpointKey("post_attention", 0), [0, 1, 2, 3, 4, 5], "attention"),
    "eps_layer3": (CheckpointKey("post_attention", 3), [3], "attention"),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_injected_bug_is_located(bug, tiny_llama, db_path, my_backend):
    first, introducing, block = BUGS[bug]
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, {"isolate": True}, "python_reference", my_backend(bug))
    result = engine.run(sid)

    assert result.verdict == "failed"
    assert result.first_divergence.key == first
    # everything before the first divergence passed
    idx = [o.key for o in result.results].index(first)
    assert all(o.passed for o in result.results[:idx])
    assert result.introducing_layers == introducing
    for lr in result.isolation:
        v = lr.verdict
        if lr.layer in introducing:
            assert lr.block == block and not v.attention.passed
            # the MLP, judged on the reference's post-attention state, is exact: never marked
            assert v.mlp is not None and v.mlp.passed and v.blocks == ["attention"]
        else:  # layers after the bug only carry the error in
            assert v.mlp.passed and v.attention.passed and v.whole.passed
            if lr.layer > introducing[0]:
                assert not lr.evidence.carried_in.passed

    # stored: status, rows in model order, the first failing row is the first divergence
    stored = engine.get_session_results(sid)
    assert stored["status"] == "failed"
    rows = stored["checkpoints"]
    assert [(r["checkpoint"], r["layer"]) for r in rows] == [tuple(o.key) for o in result.results]
    assert stored["first_divergence"]["checkpoint"] == first.name and stored["first_divergence"]["layer"] == first.layer
    assert stored["summary"]["first_divergence"]["layer"] == first.layer
    # one first divergence: the session's summary and the rows agree, and it names its row by id
    assert stored["first_divergence"] == stored["summary"]["first_divergence"]
    assert stored["first_divergence"]["id"] == str(first)
    by_key = {(r["checkpoint"], r["layer"]): r for r in rows}
    for layer in range(6):
        assert by_key[("post_attention", layer)]["introduces_error"] == (layer in introducing)
        row = by_key[("post_mlp", layer)]
        assert row["introduces_error"] is False and row["introduced"]["input"] == "reference"
        assert row["introduced_error"] is not None and row["propagated_error"] is not None


def test_eps_bug_layer3_only_propagates_afterwards(tiny_llama, db_path, my_backend):
    engine = ValidationEngine(db_path)
    res = engine.execute_validation(engine.create_session(tiny_llama, {}, "python_reference", my_backend("eps_layer3")))
    iso = {d["layer"]: d for d in res["isolation"]}
    assert iso[3]["introduces_error"] and iso[3]["blocks"] == ["attention"]
    assert iso[3]["carried_in"]["max_abs_error"] < 1e-4
    for layer in (4, 5):
        assert not iso[layer]["introduces_error"]
        assert iso[layer]["carried_in"]["max_abs_error"] > 1e-3  # carries layer 3's error in
        assert iso[layer]["layer_replay"]["max_abs_error"] < 1e-4
    assert res["first_divergence"]["checkpoint"] == "post_attention" and res["first_divergence"]["layer"] == 3
    assert res["first_divergence"]["max_abs_error"] > 1e-3


def test_correct_user_backend_passes(tiny_llama, db_path, my_backend):
    engine = ValidationEngine(db_path)
    result = engine.run(engine.create_session(tiny_llama, {"isolate": True}, "python_reference", my_backend(None)))
    assert result.passed and result.first_divergence is None and result.introducing_layers == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pytorch_vs_reference_passes_on_seeds(seed, tiny_llama, tiny_qwen2, db_path):
    engine = ValidationEngine(db_path)
    for model in (tiny_llama, tiny_qwen2):
        sid = engine.create_session(model, {"seed": seed, "isolate": seed == 0}, "python_reference", "pytorch")
        result = engine.run(sid)
        assert result.passed, result.first_divergence
        assert len(result.results) == 2 + 2 * 6
        assert engine.db.sessions.get(sid)["status"] == "passed"
        if seed == 0:
            assert result.introducing_layers == []


@pytest.mark.slow
@pytest.mark.skipif("inductor" not in registered_backends(), reason="the inductor backend is not registered")
def test_inductor_vs_pytorch_passes(tiny_llama, db_path):
    from debug_framework.backends import backend_availability

    ok, why = backend_availability()["inductor"]
    if not ok:
        pytest.skip(f"inductor unavailable: {why}")
    engine = ValidationEngine(db_path)
    for seed in (0, 1):
        result = engine.run(engine.create_session(tiny_llama, {"seed": seed, "isolate": False}, "pytorch", "inductor"))
        assert result.passed, result.first_divergence
        assert result.reference_dtype == result.alternative_dtype == "float32"


def test_enabled_checkpoints_and_per_checkpoint_tolerance(tiny_llama, db_path):
    engine = ValidationEngine(db_path)
    cfg = {"enabled_checkpoints": ["post_mlp", "post_processing"], "layers": [2, 4],
           "precision_thresholds": {"rtol": 1e-4, "atol": 1e-4, "post_mlp:3": {"rtol": 0.0, "atol": 0.0}}}
    result = engine.run(engine.create_session(tiny_llama, cfg, "python_reference", "pytorch"))
    assert [str(o.key) for o in result.results] == ["post_mlp:2", "post_mlp:3", "post_processing"]
    assert result.results[1].comparison.tolerance.atol == 0.0
    # float32 against float64 is never exact: the zero tolerance fails exactly that checkpoint
    assert str(result.first_divergence.key) == "post_mlp:3"
    assert [o.passed for o in result.results] == [True, False, True]


@pytest.mark.slow
def test_isolation_replays_inductor_layers(tiny_llama, db_path):
    """Isolation with a compiled alternative: Inductor's layers are replayed on the reference's
    inputs, so the one layer whose norm epsilon is wrong (injected before compilation) is named alone."""
    from debug_framework.backends import register_backend, unregister_backend
    from debug_framework.backends.inductor import InductorBackend

    class EpsBugInductor(InductorBackend):
        name = "inductor_eps_layer3"

        def prepare(self, model, dtype=None, device=None):
            super().prepare(model, dtype, device)
            self.net.model.layers[3].input_layernorm.variance_epsilon = 0.5  # compiled on the first run

    register_backend(EpsBugInductor.name, EpsBugInductor, replace=True)
    try:
        engine = ValidationEngine(db_path)
        result = engine.run(engine.create_session(tiny_llama, {"isolate": True}, "python_reference", EpsBugInductor.name))
    finally:
        unregister_backend(EpsBugInductor.name)
    assert result.verdict == "failed" and result.first_divergence.key == CheckpointKey("post_attention", 3)
    assert result.introducing_layers == [3]
    assert [iso.layer for iso in result.isolation] == list(range(6))
    assert result.isolation[3].block == "attention" and all(lr.evidence.replay_s > 0 for lr in result.isolation)
    for lr in result.isolation[4:]:
        assert not lr.evidence.carried_in.passed and lr.verdict.whole.passed and lr.verdict.attention.passed
