"""torchao's quantized weights in a module: which modules, which scheme, which group size; the
configuration that quantizes a float weight the same way (see the package's docstring)."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...errors import BackendInitializationError

if TYPE_CHECKING:
    from ...jsonio import JsonObject
    from ...modelio.loader import LoadedModel

__all__ = ["SCHEMES", "QuantizedWeight", "torchao_weights", "scheme_name", "scheme_counts", "config_for",
           "quantize_like", "dequantized", "declared_quantization", "float_dtype", "describe_weights",
           "declared_weights", "is_torchao_tensor", "scheme_of"]

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


def is_torchao_tensor(value: object) -> bool:
    cls = type(value)
    return isinstance(value, torch.Tensor) and cls.__module__.startswith("torchao.") \
        and callable(getattr(cls, "__tensor_flatten__", None))


def scheme_of(weight: torch.Tensor) -> tuple[str, int | None]:
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
        if is_torchao_tensor(weight):
            scheme, group = scheme_of(weight)
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


def declared_quantization(module: torch.nn.Module) -> tuple[str, str] | None:
    """What ``--dtype auto`` judges a module backend at, given its ``module`` (built at float32):
    where it holds torchao weights, the dtype of its other parameters and why; None otherwise (its
    default dtype then)."""
    found = torchao_weights(module)
    if not found:
        return None
    return float_dtype(module), (f"{describe_weights(found)}: judged at its quantization (the calibration is the "
                                 "trusted model quantized by torchao with the same configuration)")


def float_dtype(module: torch.nn.Module) -> str:
    """The dtype of ``module``'s float parameters other than torchao's (what its quantized linears
    compute in too), float32 where it has none."""
    floats = [p.dtype for p in module.parameters() if not is_torchao_tensor(p) and p.is_floating_point()]
    return str(floats[0]).removeprefix("torch.") if floats else "float32"


def describe_weights(weights: list[QuantizedWeight]) -> str:
    """One line: ``torchao int8_weight_only at 7 modules (group size 32)``."""
    groups = sorted({w.group_size for w in weights if w.group_size})
    return (f"torchao {scheme_name(weights)} at {len(weights)} modules"
            + (f" (group size {', '.join(map(str, groups))})" if groups else ""))


def declared_weights(backend: object) -> list[QuantizedWeight]:
    """The torchao-quantized weights of a module backend's module (prepared, or built for
    ``--dtype auto``); empty for any other backend."""
    module = getattr(backend, "module", None) or getattr(backend, "_declared_module", None)
    return torchao_weights(module)

