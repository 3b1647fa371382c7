"""Which quantized operators an alternative runs: an int8 graph's error is quantization, whatever
float precision its size matches (the precision diagnosis says so beside ``consistent_with``).

Read from what the backend runs: an ONNX file's nodes (QDQ pairs, integer matmuls and convolutions,
a runtime's quantized contrib operators), a PyTorch module's quantized submodules
(``torch.ao.nn.quantized``, dynamic and static) or its torchao-quantized weights (counted by scheme:
``int8_weight_only``, ``int8_dynamic_activation_int8_weight``, ``int4_weight_only``; each module
listed by :func:`quantized_modules`, see :mod:`.torchao`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..jsonio import JsonObject

__all__ = ["QUANTIZED_ONNX_OPS", "quantized_operators", "quantized_modules"]

#: ONNX (and ONNX Runtime contrib, ``com.microsoft``) operators that compute in, or convert to, an integer format.
QUANTIZED_ONNX_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul", "QAttention", "QGemm", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "MatMulNBits", "DynamicQuantizeLSTM", "QOrderedMatMul",
})


def _onnx_ops(path: Path) -> Counter[str]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ops: Counter[str] = Counter()
    stack = [graph]
    while stack:  # subgraphs (If / Loop bodies) too
        g = stack.pop()
        for node in g.node:
            ops[node.op_type] += 1
            stack.extend(a.g for a in node.attribute if a.HasField("g"))
    return ops


def quantized_operators(backend: Any) -> dict[str, int]:
    """``{operator: count}`` of the quantized operators ``backend`` runs (empty: none found, or a
    backend whose graph cannot be read here)."""
    path = getattr(backend, "model_file", None) or getattr(backend, "onnx_path", None)
    if path is not None and Path(path).suffix == ".onnx" and Path(path).is_file():
        try:
            ops = _onnx_ops(Path(path))
        except Exception:  # noqa: BLE001 - an unreadable graph: nothing can be said of it
            return {}
        return {op: n for op, n in sorted(ops.items()) if op in QUANTIZED_ONNX_OPS}
    module = getattr(backend, "module", None)
    if module is not None and hasattr(module, "modules"):
        from .torchao.weights import scheme_counts, torchao_weights

        found: Counter[str] = Counter(scheme_counts(torchao_weights(module)))
        for m in module.modules():
            cls = type(m)
            if ".quantized" in cls.__module__ and not cls.__name__.endswith("PackedParams"):  # not the weight holders
                # torch.ao.nn.quantized.dynamic.modules.linear.Linear -> quantized.dynamic.Linear
                parts = cls.__module__.split(".")
                scope = parts[parts.index("quantized"):parts.index("modules") if "modules" in parts else None]
                found[".".join([*scope, cls.__name__])] += 1
        return dict(sorted(found.items()))
    return {}


def quantized_modules(backend: Any) -> list[JsonObject]:
    """Each torchao-quantized weight of a module backend's module (prepared, or built for ``--dtype
    auto``): ``{module, scheme, group_size, tensor}`` (empty: none, or not a module backend).
    Where torch was never imported no backend holds a torch module: nothing to look for, and an
    engine computing in NumPy (an ONNX file's graph) stays torch-free."""
    import sys

    if "torch" not in sys.modules:
        return []
    from .torchao.weights import declared_weights

    return [w.to_dict() for w in declared_weights(backend)]
