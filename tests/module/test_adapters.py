"""AcceleratorAdapter: capabilities become constraints; an adapter is a torch.compile backend on ATen graphs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import debug_module as dm
from debug_module.adapters import AcceleratorAdapter, AcceleratorCapabilities, MockAcceleratorAdapter
from debug_module.config import MockConfig


class NoConvNPU(AcceleratorAdapter):
    """A pretend NPU: fp32/fp16 (+ bool masks) only, no convolutions; its 'compiler' interprets the ATen graph."""

    name = "no_conv_npu"

    def __init__(self, strict: bool = True) -> None:
        self.strict = strict
        self.received: list[tuple[str, list[str]]] = []

    def capabilities(self) -> AcceleratorCapabilities:
        return AcceleratorCapabilities(
            dtypes=frozenset({torch.float32, torch.float16, torch.bool}),
            unsupported_ops=frozenset({"aten.convolution"}),
            memory_limit=1 << 20,
        )

    def compile(self, gm, example_inputs, kind):
        self.received.append((kind, [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]))
        return gm.forward


def test_adapter_is_a_backend_receiving_aten_graphs(mlp):
    npu = NoConvNPU()
    x = torch.randn(4, 16)
    out = torch.compile(mlp, backend=npu)(x)
    out.sum().backward()
    torch.testing.assert_close(out, mlp(x))
    kinds = [k for k, _ in npu.received]
    assert kinds == ["forward", "backward"]
    assert all(op.startswith("aten.") for _, ops in npu.received for op in ops)
    assert npu.last_backend.reports and not npu.last_backend.violations


def test_adapter_capabilities_enforced_strict_and_warn(conv_net):
    with pytest.raises(Exception) as info:
        torch.compile(conv_net, backend=NoConvNPU())(torch.randn(1, 3, 8, 8))
    err = dm.constraint_error(info.value)
    assert err is not None and [v.op for v in err.violations] == ["aten.convolution.default"]

    import debug_framework._torch.dynamo as dyn

    dyn.reset()
    npu = NoConvNPU(strict=False)
    with torch.no_grad():
        torch.compile(conv_net, backend=npu)(torch.randn(1, 3, 8, 8))
    assert [v.op for v in npu.last_backend.violations] == ["aten.convolution.default"]
    assert npu.last_backend.reports[0].coverage.fallback_ops == {"aten.convolution.default": 1}


def test_capabilities_to_constraints_and_plan_accessors():
    caps = AcceleratorCapabilities(supported_ops=frozenset({"aten.mm"}), alignment=8, max_rank=4,
                                   dynamic_shapes=False, requires_contiguous=True, peak_memory_limit=10)
    names = [type(c).__name__ for c in caps.to_constraints()]
    assert names == ["DtypeConstraint", "OpAllowlistConstraint", "MemoryConstraint", "ShapeConstraint",
                     "MaxRankConstraint", "DynamicShapeConstraint", "LayoutConstraint"]
    npu = NoConvNPU()
    assert npu.get_supported_dtypes() == frozenset({torch.float32, torch.float16, torch.bool})
    assert npu.get_memory_limit() == 1 << 20 and npu.get_supported_ops() is None


def test_mock_adapter_matches_mock_config():
    adapter = MockAcceleratorAdapter(MockConfig(strict=False, alignment=8))
    assert adapter.get_alignment() == 8
    model = nn.Linear(8, 8)
    with torch.no_grad():
        torch.compile(model, backend=adapter)(torch.randn(3, 8))
    vs = adapter.last_backend.violations
    assert vs and {v.constraint for v in vs} == {"shape_alignment"}
    assert adapter.compiled_graphs and adapter.compiled_graphs[0][0] == "inference"
