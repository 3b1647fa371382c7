"""Fixtures for KernelDiff tests: Dynamo state isolation, tiny models, and test backends with known bugs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import debug_framework._torch.dynamo as dyn

    dyn.reset()
    yield
    dyn.reset()


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.fc3 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc3(self.norm(self.fc2(self.act(self.fc1(x)))))


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return TinyNet(), (torch.randn(4, 16),)


def perturbing_backend(target: str, scale: float = 0.05):
    """A backend that runs the Dynamo graph as is, except that the output of submodule ``target`` becomes
    ``y + scale * |y|`` (not removable by a following LayerNorm, unlike a constant shift or a scale)."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        last = None
        for n in gm.graph.nodes:
            stack = n.meta.get("nn_module_stack") or {}
            if n.op == "call_function" and stack and list(stack.values())[-1][0].split(".")[-1] == target:
                last = n
        assert last is not None, f"no node of module {target!r} in the graph"
        with gm.graph.inserting_after(last):
            absn = gm.graph.call_function(torch.abs, (last,))
        with gm.graph.inserting_after(absn):
            scaled = gm.graph.call_function(torch.mul, (absn, scale))
        with gm.graph.inserting_after(scaled):
            new = gm.graph.call_function(torch.add, (last, scaled))
        last.replace_all_uses_with(new)
        absn.args = (last,)
        new.args = (last, scaled)
        gm.recompile()
        return gm.forward

    backend.__name__ = f"perturb_{target}"
    return backend


class _WrongBackward(torch.autograd.Function):
    """Forward: the graph exactly. Backward: the true vector-Jacobian product, times 1.5 for the first input."""

    @staticmethod
    def forward(ctx, fn, n_out, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            out = fn(*inputs)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in ctx.saved_tensors]
        with torch.enable_grad():
            out = ctx.fn(*inputs)
            outs = tuple(out) if isinstance(out, (list, tuple)) else (out,)
            diff_in = [t for t in inputs if t.requires_grad]
            g = torch.autograd.grad(outs, diff_in, grads, allow_unused=True)
        it = iter(g)
        result = [next(it) if t.requires_grad else None for t in inputs]
        if result[0] is not None:
            result[0] = result[0] * 1.5  # the bug
        return (None, None, *result)


def wrong_backward_backend(gm: torch.fx.GraphModule, example_inputs):
    """A compiler whose forward is exact but whose backward (a custom autograd Function) is wrong."""

    def run(*inputs):
        outs = _WrongBackward.apply(gm.forward, 0, *inputs)
        return list(outs)

    return run
