"""GuardInspector: graph breaks with reasons and lines, readable guards, recompilations."""

from __future__ import annotations

import json

import pytest

import torch
import torch.nn as nn

from debug_module import GuardInspector


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        y = self.lin(x)
        if y.sum() > 0:  # BRANCH-LINE: data-dependent
            return y * scale
        return y - scale


def test_data_dependent_branch_reports_break_with_reason_and_line():
    torch.manual_seed(0)
    insp = GuardInspector(Branchy())
    report = insp.inspect(torch.randn(3, 4), scale=2.0)
    assert report.calls == 1
    assert report.graph_count == 2 and report.graph_break_count == 1
    [brk] = report.graph_breaks
    assert brk.file.endswith("test_guards.py")
    assert "BRANCH-LINE" in brk.code and brk.line > 0
    assert brk.reason  # e.g. "generic_jump TensorVariable()"
    assert "Branch" in report.summary() or "break" in report.summary()
    json.loads(report.to_json())


def test_guards_are_readable_expressions_for_positional_and_keyword_inputs():
    insp = GuardInspector(Branchy())
    report = insp.inspect(torch.randn(3, 4), scale=2.0)
    text = "\n".join(e for s in report.guard_sets for e in s.expressions)
    assert "check_tensor(L['x']" in text and "size=[3, 4]" in text
    assert "L['scale'] == 2.0" in text
    assert all(s.graph_indices for s in report.guard_sets)


def test_new_shape_and_dtype_cause_recompilations_with_reasons():
    insp = GuardInspector(Branchy())
    m = insp.model
    insp(torch.randn(3, 4), scale=2.0)
    insp(torch.randn(5, 4), scale=2.0)           # new batch size
    out = insp(torch.randn(5, 4), scale=2.0)     # same again: cached, no recompilation
    torch.testing.assert_close(out.shape, m(torch.randn(5, 4), scale=2.0).shape)
    report = insp.report()
    assert report.calls == 3
    recompiles = report.recompilations
    assert recompiles and {r.call_index for r in recompiles} == {1}
    assert any("size mismatch" in reason and "expected 3, actual 5" in reason
               for r in recompiles for reason in r.reasons)

    def fn(x):
        return x * 2 + 1

    insp2 = GuardInspector(fn)
    insp2(torch.randn(2, 4))
    insp2(torch.randn(2, 4, dtype=torch.float64))  # dtype change
    reasons = [x for r in insp2.report().recompilations for x in r.reasons]
    assert any("dtype mismatch" in x for x in reasons)


def test_recompile_limit_raises_instead_of_running_eagerly():
    """Layer replays compile one code object once per layer: ``recompile_limit`` lets them, and
    turns running past the limit into an error (Dynamo alone falls back to eager silently)."""
    from debug_framework._torch import dynamo as dynamo_private

    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
              torch.int32, torch.int64, torch.uint8, torch.complex64]  # one guard set each

    def twice(x):
        return x * 2

    quiet = torch.compile(twice, backend="eager")
    assert all(torch.equal(quiet(torch.ones(3, dtype=d)), torch.full((3,), 2, dtype=d)) for d in dtypes)
    loud = torch.compile(lambda x: x * 3, backend="eager")
    with dynamo_private.recompile_limit(len(dtypes)):  # enough: no error
        for d in dtypes:
            loud(torch.ones(3, dtype=d))
    strict = torch.compile(lambda x: x * 4, backend="eager")
    with pytest.raises(Exception, match="recompile_limit"):
        with dynamo_private.recompile_limit(1):  # 1 asks for no more than Dynamo's default (8)
            for d in dtypes:
                strict(torch.ones(3, dtype=d))
