"""A correct run at a module's torchao quantization, and the precision a module backend holding
torchao weights declares (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ...errors import BackendInitializationError
from ..torch_module import TorchModuleBackend
from .weights import QuantizedWeight, describe_weights, float_dtype, quantize_like, scheme_name, torchao_weights

if TYPE_CHECKING:
    from ...modelio.loader import LoadedModel
    from ..base import Backend

__all__ = ["TorchaoReferenceBackend", "TorchaoPrecision", "torchao_precision"]


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
        from ..pytorch import build_hf_model

        found = torchao_weights(getattr(self.alternative, "module", None))
        if not found:
            raise BackendInitializationError(
                f"the alternative {getattr(self.alternative, 'name', '?')!r} holds no torchao-quantized weight "
                "to reproduce", backend=self.name, hint="leave calibration_backend 'auto'")
        net = build_hf_model(model, dtype, device)
        quantize_like(net, found)
        self.scheme = scheme_name(found)
        return net


@dataclass(frozen=True)
class TorchaoPrecision:
    """The precision a module backend computes at when its module holds torchao-quantized weights
    (an :class:`~debug_framework.backends.base.EmulatedPrecision`): ``name`` the scheme
    (``int8_weight_only``; schemes joined by ``+`` for a module quantized two ways), ``dtype`` its
    float dtype, ``weights`` the quantized modules; its trusted emulation is
    :class:`TorchaoReferenceBackend` over ``alternative``."""

    name: str
    dtype: str
    weights: tuple[QuantizedWeight, ...]
    alternative: Backend = field(compare=False, repr=False)

    def describe(self) -> str:
        """One line: ``torchao int8_weight_only at 7 modules (group size 32), float32 elsewhere``."""
        return f"{describe_weights(list(self.weights))}, {self.dtype} elsewhere"

    def trusted_backend(self) -> TorchaoReferenceBackend:
        """The trusted eager model quantized by torchao as ``alternative``'s module is."""
        return TorchaoReferenceBackend(self.alternative)


def torchao_precision(backend: Backend, module: torch.nn.Module) -> TorchaoPrecision | None:
    """The precision ``backend`` computes at, given its ``module``: None where the module holds no
    torchao-quantized weight."""
    found = torchao_weights(module)
    if not found:
        return None
    return TorchaoPrecision(scheme_name(found), float_dtype(module), tuple(found), backend)
