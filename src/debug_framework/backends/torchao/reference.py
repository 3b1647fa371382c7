"""A correct run at a module's torchao quantization (see the package's docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import BackendInitializationError
from ..torch_module import TorchModuleBackend
from .weights import quantize_like, scheme_name, torchao_weights

if TYPE_CHECKING:
    from ...modelio.loader import LoadedModel
    from ..base import Backend

__all__ = ["TorchaoReferenceBackend"]


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
