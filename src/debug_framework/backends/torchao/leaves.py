"""The drill-down's view of a torchao-quantized linear: one traced operator (see the package's
docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ...errors import BackendInitializationError
from .weights import QuantizedWeight, config_for, dequantized, is_torchao_tensor, scheme_of

__all__ = ["QuantizedLeaves", "quantized_leaves", "quantized_weight", "is_quantized_call", "kernel_of", "call_of",
           "weight_error", "correct_quantized_error"]


@dataclass
class _Call:
    """How to rebuild one quantized weight from its inner tensors, and what it is."""

    cls: type
    names: list[str]
    ctx: object
    size: torch.Size
    stride: tuple[int, ...]
    module: str          # the module's path in the model
    param: str           # the weight's path in the layer (``self_attn.q_proj.weight``)
    weight: QuantizedWeight
    kernel: str = "?"

    def rebuild(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return self.cls.__tensor_unflatten__(dict(zip(self.names, parts)), self.ctx, self.size, self.stride)


#: handle -> the quantized weight it stands for (the traced graph's integer argument)
_CALLS: dict[int, _Call] = {}


@torch.library.custom_op("debug_framework::quantized_linear", mutates_args=())
def _quantized_linear(x: torch.Tensor, parts: list[torch.Tensor], handle: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the torchao weight ``handle`` rebuilt from ``parts``; an input
    of another dtype (a graph run in float64) is computed at the weight's and cast back."""
    weight = _CALLS[handle].rebuild(list(parts))
    if x.dtype != weight.dtype:
        b = None if bias is None else bias.to(weight.dtype)
        return torch.nn.functional.linear(x.to(weight.dtype), weight, b).to(x.dtype)
    return torch.nn.functional.linear(x, weight, bias).clone()


@_quantized_linear.register_fake
def _(x: torch.Tensor, parts: list[torch.Tensor], handle: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], int(_CALLS[handle].size[0])))


_OP = torch.ops.debug_framework.quantized_linear.default


def quantized_weight(handle: int, parts: list[torch.Tensor]) -> torch.Tensor:
    """The torchao weight a quantized-linear node's ``handle`` stands for, rebuilt from ``parts``."""
    return _CALLS[handle].rebuild(list(parts))


def is_quantized_call(node: torch.fx.Node) -> bool:
    """Whether a traced node is a torchao-quantized linear (:func:`quantized_leaves`)."""
    return node.op == "call_function" and node.target is _OP


def call_of(node: torch.fx.Node) -> _Call:
    """What a quantized-linear node stands for: its weight's class, module, scheme and kernel."""
    return _CALLS[int(node.args[2])]


def kernel_of(node: torch.fx.Node) -> str:
    """The kernel a quantized-linear node runs (``aten._int_mm.default``), else the node's target."""
    return call_of(node).kernel if is_quantized_call(node) else str(node.target)


_KERNELS = ("aten._weight_int4pack_mm_for_cpu", "aten._int_mm", "aten.mm", "aten.addmm", "aten.bmm", "aten.matmul")


def _kernel(call: _Call, parts: list[torch.Tensor], x: torch.Tensor) -> str:
    """The matrix product the subclass's linear dispatches (recorded once, on the one-row ``x``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Record():
        torch.nn.functional.linear(x, call.rebuild(parts))
    for family in _KERNELS:
        hit = next((op for op in seen if op.rsplit(".", 1)[0] == family), None)
        if hit is not None:
            return hit
    return seen[-1] if seen else "?"


@dataclass
class QuantizedLeaves:
    """The torchao weights of a layer as traced graph inputs: ``names`` (their parameter paths, not
    given to ``functional_call``), ``paths``/``inputs`` (one per inner tensor:
    ``param:<weight>.<inner>``)."""

    names: set[str] = field(default_factory=set)
    paths: list[str] = field(default_factory=list)
    inputs: list[torch.Tensor] = field(default_factory=list)
    current: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    slices: dict[str, tuple[int, int]] = field(default_factory=dict)

    def bind(self, flat: tuple[torch.Tensor, ...], start: int) -> None:
        """The traced function's values of the inner tensors (``flat[start:]`` in ``paths`` order)."""
        for name, (a, b) in self.slices.items():
            self.current[name] = list(flat[start + a:start + b])


@contextlib.contextmanager
def quantized_leaves(layer: torch.nn.Module, layer_name: str) -> Iterator[QuantizedLeaves]:
    """While tracing ``layer``: each linear holding a torchao weight calls
    ``debug_framework::quantized_linear`` on the weight's inner tensors (bound by
    :meth:`QuantizedLeaves.bind`), so the graph holds the quantized linear as one operator whose
    inputs are plain tensors; nothing changes for a layer without one."""
    leaves = QuantizedLeaves()
    patched: list[torch.nn.Module] = []
    try:
        for path, sub in layer.named_modules():
            weight = sub._parameters.get("weight")
            if not is_torchao_tensor(weight) or not isinstance(sub, torch.nn.Linear):
                continue
            names, ctx = type(weight).__tensor_flatten__(weight)
            param = f"{path}.weight" if path else "weight"
            parts = [getattr(weight, n) for n in names]
            scheme, group = scheme_of(weight)
            full = f"{layer_name}.{path}" if path else layer_name
            call = _Call(type(weight), list(names), ctx, weight.shape, tuple(weight.stride()), full, param,
                         QuantizedWeight(full, scheme, group, type(weight).__name__))
            handle = id(weight)
            _CALLS[handle] = call
            call.kernel = _kernel(call, parts, torch.zeros(1, int(weight.shape[-1]), dtype=weight.dtype,
                                                           device=weight.device))
            leaves.names.add(param)
            start = len(leaves.paths)
            leaves.paths += [f"param:{param}.{n}" for n in names]
            leaves.inputs += parts
            leaves.slices[param] = (start, len(leaves.paths))
            leaves.current[param] = parts

            def forward(x: torch.Tensor, _m: torch.nn.Module = sub, _p: str = param, _h: int = handle) -> torch.Tensor:
                return _quantized_linear(x, leaves.current[_p], _h, _m.bias)

            sub.forward = forward  # type: ignore[method-assign]
            patched.append(sub)
        yield leaves
    finally:
        for sub in patched:
            del sub.forward


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).pow(2).mean().sqrt()) if a.numel() else 0.0


def weight_error(node: torch.fx.Node, parts: list[torch.Tensor], weight64: torch.Tensor) -> float:
    """RMS of a quantized-linear node's weight (rebuilt from ``parts``, dequantized) against the
    reference's float weight ``weight64``."""
    return _rms(dequantized(call_of(node).rebuild(parts)), weight64)


def correct_quantized_error(node: torch.fx.Node, x: torch.Tensor, weight64: torch.Tensor,
                            bias: torch.Tensor | None, trusted: torch.Tensor) -> tuple[float, float] | None:
    """For a quantized-linear node: ``(output error, weight error)`` of a correct quantization of the
    reference's float weight ``weight64`` (torchao's ``quantize_``, the same configuration) at the
    alternative's precision (``x``'s dtype), run on ``x`` (the trusted input cast as the
    alternative's) against ``trusted`` ``[..., out]``, its dequantized weight against ``weight64``;
    None where the scheme cannot be reproduced."""
    from torchao.quantization import quantize_

    call = call_of(node)
    try:
        config = config_for(call.weight)
    except BackendInitializationError:
        return None
    out_features, in_features = int(weight64.shape[0]), int(weight64.shape[-1])
    lin = torch.nn.Linear(in_features, out_features, bias=bias is not None, dtype=x.dtype, device=x.device)
    with torch.no_grad():
        lin.weight.copy_(weight64.to(x.dtype))
        if bias is not None:
            lin.bias.copy_(bias.to(x.dtype))
    quantize_(lin, config)
    with torch.no_grad():
        out = lin(x)
    return _rms(out, trusted), _rms(dequantized(lin.weight), weight64)
