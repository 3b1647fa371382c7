"""``HookCapture(modules=...)``: a capture given the model's module map looks every name up there
(the model is not walked on entry) and captures what a capture that walks it captures."""

from __future__ import annotations

import torch

from debug_framework.capture.hooks import HookCapture, ModuleTap
from debug_framework.capture.keys import CheckpointKey


class _Two(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_capture_given_the_module_map_does_not_walk_the_model(monkeypatch):
    torch.manual_seed(0)
    model, x = _Two(), torch.randn(2, 3)
    taps = [ModuleTap("layers.1", CheckpointKey("post_mlp", 1)), ModuleTap("0", CheckpointKey("post_mlp", 0))]
    with HookCapture(model, taps, layer_modules={1: "layers.1"}) as walked:
        model(x)
    modules = dict(model.named_modules())
    walks = []
    monkeypatch.setattr(_Two, "named_modules", lambda self, *a, **k: walks.append(1) or iter(()))
    for _ in range(2):  # one map, many entries (a decode's passes)
        with HookCapture(model, taps, layer_modules={1: "layers.1"}, modules=modules) as given:
            model(x)
        assert walks == []
        assert list(given.tensors) == list(walked.tensors)
        assert all(torch.equal(given.tensors[k], walked.tensors[k]) for k in walked.tensors)
        assert torch.equal(given.layer_inputs[1], walked.layer_inputs[1])
