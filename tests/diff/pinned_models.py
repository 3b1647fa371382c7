"""Small models for the KernelDiff tests of user backends: models that pin a dtype inside (``.float()``,
``.to(h.dtype)``), and one gradient failure that eager's rounding causes (``--model file.py:name``).
Factories return ``(model, inputs)``."""

import torch
import torch.nn.functional as F


def _gen():
    return torch.Generator().manual_seed(0)


class ExpMLP(torch.nn.Module):
    """``exp(lin(x)) * 2 + 1``: one exp, one multiply by a constant, one add."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.exp(self.lin(x)) * 2.0 + 1.0


class PinsFloat(torch.nn.Module):
    """Casts its input to float32 with ``.float()`` before a Linear (a float64 run must widen it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.exp(self.lin(x.float()))


class PinsToDtype(torch.nn.Module):
    """Casts to another tensor's dtype (``.to(h.dtype)``): Dynamo bakes ``float32`` into the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.lin2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return torch.exp(self.lin2(torch.tanh(x).to(h.dtype)) + h)


class Float32Only(torch.nn.Module):
    """Refuses any input but float32: no reference can widen this."""

    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError(f"Float32Only takes float32, got {x.dtype}")
        return torch.exp(x)


def exp_mlp():
    torch.manual_seed(0)
    return ExpMLP(), (torch.randn(4, 8, generator=_gen()),)


def pins_float():
    torch.manual_seed(0)
    return PinsFloat(), (torch.randn(4, 8, generator=_gen()),)


def pins_to_dtype():
    torch.manual_seed(0)
    return PinsToDtype(), (torch.randn(4, 8, generator=_gen()),)


def float32_only():
    return Float32Only(), (torch.randn(4, 8, generator=_gen()),)


def _margin(x, y, t):
    return F.margin_ranking_loss(x, y, t, margin=1.7)


def margin_bf16():
    """bf16 ``margin_ranking_loss`` on the hinge: eager rounds the margin to bf16 (1.703125) and lands on
    it, a compiler computing in float32 does not, so only the gradient differs."""
    bf = torch.bfloat16
    return _margin, (torch.tensor([1.703125, 1.703125], dtype=bf), torch.zeros(2, dtype=bf), torch.ones(2, dtype=bf))


# --model/--inputs factories for the CLI
def make_exp_mlp():
    return exp_mlp()[0]


def make_exp_mlp_inputs():
    return exp_mlp()[1]


class ExpandedAfterBreak(torch.nn.Module):
    """``exp`` of an expanded mean after a graph break: the second Dynamo graph is given a stride-0
    tensor (stride ``(0, 1)``), the layout a repro must keep and restore."""

    def forward(self, x):
        y = x.mean(0).expand(3, 4)
        torch._dynamo.graph_break()
        return torch.exp(y) * 2.0


def make_expanded_after_break():
    return ExpandedAfterBreak()


def make_expanded_after_break_inputs():
    return (torch.randn(5, 4, generator=_gen()),)
