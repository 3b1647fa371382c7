"""What the precision diagnosis says of a quantized alternative: its quantized operators, read from
what it runs, and words that name quantization rather than a float precision."""

from __future__ import annotations

import torch

from debug_framework.backends.quantized import quantized_operators
from debug_framework.reports._common import precision_text


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_dynamically_quantized_module_names_its_quantized_linears():
    class Backend:  # what the diagnosis reads of a module backend: its module
        module = torch.ao.quantization.quantize_dynamic(_Net().eval(), {torch.nn.Linear}, dtype=torch.qint8)

    assert quantized_operators(Backend()) == {"quantized.dynamic.Linear": 2}

    class Plain:
        module = _Net()

    assert quantized_operators(Plain()) == {}
    assert quantized_operators(object()) == {}


def test_the_words_name_quantization_only_for_a_quantized_alternative():
    plain = precision_text("bfloat16", "float32")
    assert plain.startswith("consistent with a correct bfloat16 run") and "declared float32" in plain
    q = precision_text("bfloat16", "float32", {"MatMulInteger": 12, "DynamicQuantizeLinear": 12})
    assert "MatMulInteger x12" in q and "comes from quantization, not from bfloat16" in q
