"""What a precision can hide (issue 48, items 5 and 6): each checkpoint states the smallest relative
change of its output its bound would catch (``detectable_change`` = bound / RMS of the reference),
the run states the coarsest one, and a change above that figure fails while one well below it
passes; each checkpoint's judged metric and its value stand beside its bound."""

from __future__ import annotations

import pytest

from debug_framework.services.validation.results import ValidationResult

pytestmark = pytest.mark.slow


def _scale_output(delta: float):
    """A patch that scales the final norm's output by ``1 + delta``: the logits (post_processing,
    lm_head has no bias) change by exactly that relative amount."""

    def patch(net):
        net.model.norm.register_forward_hook(lambda _m, _i, out: out * (1.0 + delta))

    return patch


def test_a_change_above_what_the_bound_sees_fails_and_one_well_below_passes(tiny_models, engine, patched_backend):
    model = tiny_models("llama", 0)
    cfg = {"dtype": "bfloat16", "isolate": False}
    correct = engine.run(engine.create_session(model, cfg, "python_reference", "pytorch"))
    assert correct.passed
    rows = {r.id: r for r in correct.results}
    head = rows["post_processing"]
    # the judged metric and its value are what the bound holds: margin = judged error / bound
    assert head.judged_metric == "rmse" and head.judged_error == pytest.approx(head.comparison.rmse)
    assert head.margin == pytest.approx(head.judged_error / head.bound)
    assert head.reference_rms > 0
    sees = head.detectable_change
    assert sees == pytest.approx(head.bound / head.reference_rms) and 0 < sees < 1
    summary = correct.sensitivity()
    assert summary["dtype"] == "bfloat16" and summary["checkpoints"] == len(correct.results)
    assert summary["coarsest"]["change"] == max(r.detectable_change for r in correct.results)

    caught = engine.run(engine.create_session(model, cfg, "python_reference",
                                              patched_backend("scaled_3x", _scale_output(3.0 * sees))))
    assert not {r.id: r for r in caught.results}["post_processing"].passed
    hidden = engine.run(engine.create_session(model, cfg, "python_reference",
                                              patched_backend("scaled_fifth", _scale_output(sees / 5.0))))
    assert {r.id: r for r in hidden.results}["post_processing"].passed

    # every view reads the same figures: the JSON, the stored result and its round trip
    doc = correct.to_dict()
    assert doc["detectable_change"] == summary
    by_id = {r["id"]: r for r in doc["results"]}
    assert by_id["post_processing"]["detectable_change"] == pytest.approx(sees)
    assert by_id["post_processing"]["judged_metric"] == "rmse"
    stored = ValidationResult.load(engine.db, correct.session_id)
    assert {r.id: r for r in stored.results}["post_processing"].detectable_change == pytest.approx(sees)
    assert ValidationResult.from_dict(doc).sensitivity() == summary
