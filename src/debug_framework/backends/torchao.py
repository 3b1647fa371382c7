"""torchao's quantized weights in a module backend: recognised, reproduced on the trusted model, and
seen through by the drill-down.

torchao (``torchao.quantization.quantize_``) swaps a linear's weight for a tensor subclass whose
``__torch_function__`` runs the quantized kernel: ``Int8Tensor`` (``Int8WeightOnlyConfig``: an
``aten.mm`` on the int8 data then the scales; ``Int8DynamicActivationInt8WeightConfig``: the
activation quantized per row, then ``aten._int_mm``), ``Int4OpaqueTensor``
(``PrototypeInt4WeightOnlyConfig(group_size=...)``: ``aten._weight_int4pack_mm_for_cpu``).

* :func:`torchao_weights` finds them in any module (:class:`QuantizedWeight`: the module, the
  scheme, the group size, the tensor class); :data:`SCHEMES` names the schemes as the results do.
* :class:`TorchaoReferenceBackend` is a correct run at that quantization: the trusted eager model
  (transformers' code, the file's weights) quantized by torchao with the same configuration at the
  same modules. It is the calibration of a session judged at the alternative's quantization
  (``--dtype auto``: ``calibration_backend`` ``"torchao"``) and the precision diagnosis's candidate
  (``consistent_with`` ``"int8_weight_only"``).
* :func:`quantized_leaves` makes each quantized linear one operator of a traced layer graph
  (``debug_framework::quantized_linear``, its weight's inner tensors as graph inputs), which the
  replay drill-down runs on the alternative's own quantized weight and judges against the trusted
  layer's float64 output of that module; :func:`kernel_of` names the kernel it runs
  (``aten._int_mm.default``...), :func:`correct_quantized_error` is what a correct quantization of the
  reference's weight errs there.

torchao is imported only where a module already holds its tensors (it is in ``sys.modules`` then).
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..errors import BackendInitializationError
from .torch_module import TorchModuleBackend

if TYPE_CHECKING:
    from ..jsonio import JsonObject
    from ..modelio.loader import LoadedModel
    from .base import Backend

__all__ = ["SCHEMES", "QuantizedWeight", "torchao_weights", "scheme_name", "scheme_counts", "config_for",
           "quantize_like", "dequantized", "TorchaoReferenceBackend", "declared_quantization", "declared_scheme",
           "quantized_leaves", "quantized_weight", "is_quantized_call", "kernel_of", "call_of", "weight_error",
           "correct_quantized_error"]

#: The schemes recognised, as results name them (``consistent_with``, the ``quantized`` section).
SCHEMES = ("int8_weight_only", "int8_dynamic_activation_int8_weight", "int4_weight_only")

#: torchao's int4 tensor classes (whatever their packing, a weight-only int4 linear)
_INT4 = frozenset({"Int4OpaqueTensor", "Int4Tensor", "Int4PlainInt32Tensor", "Int4PreshuffledTensor",
                   "Int4TilePackedTo4dTensor"})


@dataclass(frozen=True)
class QuantizedWeight:
    """One torchao-quantized weight: its module's path, the scheme (one of :data:`SCHEMES`, or
    ``torchao.<TensorClass>`` for a class this framework does not know), the group size (None: per
    row) and the tensor class."""

    module: str
    scheme: str
    group_size: int | None
    tensor: str

    def to_dict(self) -> JsonObject:
        return {"module": self.module, "scheme": self.scheme, "group_size": self.group_size, "tensor": self.tensor}


def _is_torchao_tensor(value: object) -> bool:
    cls = type(value)
    return isinstance(value, torch.Tensor) and cls.__module__.startswith("torchao.") \
        and callable(getattr(cls, "__tensor_flatten__", None))


def _scheme(weight: torch.Tensor) -> tuple[str, int | None]:
    """``(scheme, group size)`` of a torchao tensor."""
    cls = type(weight).__name__
    block = list(getattr(weight, "block_size", None) or [])
    last = int(block[-1]) if block else None
    group = last if last is not None and last < int(weight.shape[-1]) else None
    if cls == "Int8Tensor":
        dynamic = getattr(weight, "act_quant_kwargs", None) is not None
        return ("int8_dynamic_activation_int8_weight" if dynamic else "int8_weight_only"), group
    if cls in _INT4:  # always grouped: its group size is the block's width, whatever the row's
        return "int4_weight_only", last
    return f"torchao.{cls}", group


def torchao_weights(module: object) -> list[QuantizedWeight]:
    """Every torchao-quantized weight of ``module`` (an ``nn.Module``), in module order; empty for
    anything else, or where torchao was never imported (no module can hold its tensors then)."""
    if "torchao" not in sys.modules or not isinstance(module, torch.nn.Module):
        return []
    found = []
    for path, sub in module.named_modules():
        weight = sub._parameters.get("weight")
        if _is_torchao_tensor(weight):
            scheme, group = _scheme(weight)
            found.append(QuantizedWeight(path, scheme, group, type(weight).__name__))
    return found


def scheme_name(weights: list[QuantizedWeight]) -> str:
    """The one name of the quantization ``weights`` make: their scheme (``int4_weight_only``), or the
    schemes in order of first use joined by ``+`` for a module quantized two ways."""
    return "+".join(dict.fromkeys(w.scheme for w in weights))


def scheme_counts(weights: list[QuantizedWeight]) -> dict[str, int]:
    """``{scheme: modules}`` (the precision diagnosis's ``quantized`` section for a torchao module)."""
    return dict(sorted(Counter(w.scheme for w in weights).items()))


def config_for(weight: QuantizedWeight) -> object:
    """The torchao configuration that quantizes a float weight as ``weight`` is; raises
    BackendInitializationError (DF002) for a scheme this framework cannot reproduce."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig
    from torchao.quantization.granularity import PerGroup, PerRow

    granularity = PerRow() if weight.group_size is None else PerGroup(weight.group_size)
    if weight.scheme == "int8_weight_only":
        return Int8WeightOnlyConfig(granularity=granularity)
    if weight.scheme == "int8_dynamic_activation_int8_weight":
        return Int8DynamicActivationInt8WeightConfig(granularity=granularity)
    if weight.scheme == "int4_weight_only" and weight.tensor == "Int4OpaqueTensor":
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=weight.group_size or 128)
    raise BackendInitializationError(
        f"{weight.module}'s weight is a torchao {weight.tensor} ({weight.scheme}), which this framework cannot "
        "quantize again for a correct run", backend="torchao_reference",
        hint="judge it at --dtype float32 (its error is then measured against float64, not against a correct "
             "quantization), or quantize with int8_weight_only, int8_dynamic_activation_int8_weight or "
             "PrototypeInt4WeightOnlyConfig")


def quantize_like(net: torch.nn.Module, weights: list[QuantizedWeight]) -> None:
    """Quantize ``net``'s modules at ``weights``' paths with the same configurations (torchao's own
    ``quantize_``). BackendInitializationError (DF002) where ``net`` has no such module."""
    from torchao.quantization import quantize_

    names = dict(net.named_modules())
    missing = [w.module for w in weights if w.module not in names]
    if missing:
        raise BackendInitializationError(
            f"the trusted model has no module {missing[0]!r} that the alternative quantized"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""), backend="torchao_reference",
            hint="give the quantized modules the Hugging Face module names (build the module with build_hf_model, "
                 "then quantize_ it), or judge at --dtype float32")
    for w in weights:
        target = names[w.module]
        quantize_(target, config_for(w), filter_fn=lambda m, fqn, t=target: m is t)


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """A quantized weight's values as a plain tensor of its dtype: its own ``dequantize()``, else the
    weight applied to the identity (a packed int4 weight has no other way out)."""
    fn = getattr(weight, "dequantize", None)
    if callable(fn):
        try:
            return fn().detach()
        except (NotImplementedError, TypeError, RuntimeError):
            pass
    eye = torch.eye(int(weight.shape[-1]), dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        return torch.nn.functional.linear(eye, weight).t().contiguous()


class TorchaoReferenceBackend(TorchModuleBackend):
    """A correct run at the alternative's torchao quantization: the Hugging Face eager model of the
    architecture with the file's weights (``build_hf_model``), its modules quantized by torchao as
    ``alternative``'s are (:func:`quantize_like`). ``alternative`` must be prepared first: its module
    says what to quantize."""

    def __init__(self, alternative: Backend) -> None:
        super().__init__("torchao_reference", self._quantized_model)
        self.alternative = alternative
        self.scheme: str | None = None

    def _quantized_model(self, model: LoadedModel, dtype: torch.dtype, device: str) -> torch.nn.Module:
        from .pytorch import build_hf_model

        found = torchao_weights(getattr(self.alternative, "module", None))
        if not found:
            raise BackendInitializationError(
                f"the alternative {getattr(self.alternative, 'name', '?')!r} holds no torchao-quantized weight "
                "to reproduce", backend=self.name, hint="leave calibration_backend 'auto'")
        net = build_hf_model(model, dtype, device)
        quantize_like(net, found)
        self.scheme = scheme_name(found)
        return net


def declared_quantization(backend: TorchModuleBackend, model: LoadedModel) -> tuple[str, str] | None:
    """What ``--dtype auto`` judges a module backend at: where its module (built once here at
    float32 on its own copy of the weights, kept for its ``prepare``) holds torchao weights, the
    dtype of its other parameters and why; None otherwise (its default dtype then)."""
    module = backend.built_module(model, "float32")
    found = torchao_weights(module)
    if not found:
        return None
    floats = [p.dtype for p in module.parameters() if not _is_torchao_tensor(p) and p.is_floating_point()]
    dtype = str(floats[0]).removeprefix("torch.") if floats else "float32"
    groups = sorted({w.group_size for w in found if w.group_size})
    return dtype, (f"torchao {scheme_name(found)} at {len(found)} modules"
                   + (f" (group size {', '.join(map(str, groups))})" if groups else "")
                   + ": judged at its quantization (the calibration is the trusted model quantized by torchao "
                     "with the same configuration)")


def declared_scheme(backend: object) -> str | None:
    """The torchao scheme a module backend's module holds (None: none, or not built yet)."""
    module = getattr(backend, "module", None) or getattr(backend, "_declared_module", None)
    found = torchao_weights(module)
    return scheme_name(found) if found else None


# -- the drill-down: a quantized linear as one operator ------------------------------------------


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
    """``F.linear(x, weight, bias)`` with the torchao weight ``handle`` rebuilt from ``parts``."""
    return torch.nn.functional.linear(x, _CALLS[handle].rebuild(list(parts)), bias).clone()


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
            if not _is_torchao_tensor(weight) or not isinstance(sub, torch.nn.Linear):
                continue
            names, ctx = type(weight).__tensor_flatten__(weight)
            param = f"{path}.weight" if path else "weight"
            parts = [getattr(weight, n) for n in names]
            scheme, group = _scheme(weight)
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
