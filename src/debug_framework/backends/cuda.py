"""``cuda``: the ``pytorch`` backend (Hugging Face eager) on a CUDA device.

Timing is bracketed by device synchronisation (``debug_framework.measure.Timer`` in
``TorchModuleBackend.run``), so ``elapsed_s`` is the GPU's work, not the launch. Unavailable, with the reason, where there is no CUDA device.
"""

from __future__ import annotations

import torch

from ..errors import BackendInitializationError
from ..modelio.loader import LoadedModel
from .pytorch import PyTorchBackend

__all__ = ["CudaBackend"]


class CudaBackend(PyTorchBackend):
    """PyTorch eager on ``cuda`` (``cuda:N`` accepted); float32 (default), float16, bfloat16, float64."""

    def __init__(self, device: str = "cuda") -> None:
        super().__init__(device=device)
        self.name = "cuda"

    def availability(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            build = f"CUDA build {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            return False, f"no CUDA device: torch {torch.__version__} is {build} and torch.cuda.is_available() is False"
        return super().availability()

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        if device is not None and not str(device).startswith("cuda"):
            raise BackendInitializationError(
                f"the cuda backend runs on a CUDA device, not {device!r}", hint="use the 'pytorch' backend for cpu",
                backend=self.name,
            )
        super().prepare(model, dtype, device)
