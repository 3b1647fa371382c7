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


def test_every_view_shows_the_judged_error_beside_its_bound_and_what_it_sees(tiny_models, engine):
    import csv
    import io

    from rich.console import Console

    from debug_framework.cli.debug_validate import _fmt, _print_summary
    from debug_framework.models.validation_report import ValidationReport
    from debug_framework.reports import render_report
    from debug_framework.reports._sections import change_text

    result = engine.run(engine.create_session(tiny_models("llama", 0), {"dtype": "bfloat16", "isolate": False},
                                              "python_reference", "pytorch"))
    head = {r.id: r for r in result.results}["post_processing"]
    coarsest = result.sensitivity()["coarsest"]
    report = ValidationReport.from_session(result.session_id, engine.db)
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(render_report(report, "csv")))}
    row = rows["post_processing"]
    assert row["judged_by"] == "calibration" and row["judged_metric"] == "rmse"
    assert float(row["judged_error"]) == pytest.approx(head.judged_error)
    assert float(row["bound"]) == pytest.approx(head.bound) and float(row["margin"]) == pytest.approx(head.margin)
    assert float(row["detectable_change"]) == pytest.approx(head.detectable_change)
    html = render_report(report, "html")
    assert "<th>judged</th><th>bound</th>" in html and f"RMSE {head.judged_error:.4g}"[:9] in html
    assert 'id="sensitivity"' in html and f"{change_text(coarsest['change'])} at {coarsest['id']}" in html
    console = Console(width=200, record=True, color_system=None)
    with console.capture() as cap:
        _print_summary(console, result, True, "footer")
    out = cap.get()
    line = next(x for x in out.splitlines() if "post_processing" in x)
    cells = [c.strip() for c in line.split("│")]
    at = cells.index(_fmt(head.judged_error))  # the judged error, then its bound, then what it sees
    assert cells[at + 1] == _fmt(head.bound) and cells[at + 2] == change_text(head.detectable_change)
    assert f"at bfloat16 this run can see a relative change of {change_text(coarsest['change'])}" in out
