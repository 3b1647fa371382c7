"""``MetalBackend``: the spec's Metal integration, a front for the ``metal`` backend (MLX on the
Metal GPU of Apple silicon).

    backend = MetalBackend(metal_path=config["metal_path"])   # PIE_METAL_PATH, read by config.py
    backend.initialize()                                     # True, or BackendInitializationError (DF002) with the reason
    capture = backend.execute_model("path/to/model", inputs) # Capture: CheckpointKey -> array
    backend.cleanup()

``metal_path`` names an optional directory of user Metal kernels (``*.metal``, ``*.metallib``): it
is checked and recorded now; loading the kernels belongs to the plugin work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..backends.mlx.runner import MLXMetalBackend
from ..capture.keys import Capture
from ..errors import BackendInitializationError, ConfigurationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import load_model

__all__ = ["MetalBackend"]


class MetalBackend:
    """Metal compute through MLX.

    Args:
        metal_path: optional directory of user Metal kernels (``PIE_METAL_PATH``; pass it in).
    """

    def __init__(self, metal_path: str | None = None) -> None:
        self.metal_path = None if metal_path is None else Path(metal_path)
        self.backend = MLXMetalBackend(metal_path=self.metal_path)
        self.kernel_files: list[str] = []
        self.initialized = False
        self._loaded: dict[str, Any] = {}

    def initialize(self) -> bool:
        """Check that Metal is here and that ``metal_path`` (if given) is a directory.

        Returns:
            True once ready.

        Raises:
            BackendInitializationError: no Metal device (e.g. Linux), or a bad ``metal_path`` (DF002).
        """
        ok, reason = self.backend.availability()
        if not ok:
            raise BackendInitializationError(reason, backend="metal")
        if self.metal_path is not None:
            if not self.metal_path.is_dir():
                raise BackendInitializationError(
                    f"metal_path {self.metal_path} is not a directory", hint="point PIE_METAL_PATH at the kernels' directory",
                    backend="metal",
                )
            self.kernel_files = sorted(str(p) for p in self.metal_path.iterdir() if p.suffix in (".metal", ".metallib"))
        self.initialized = True
        return True

    def version_info(self) -> dict[str, Any]:
        """The ``metal`` backend's versions plus the user kernels found under ``metal_path``."""
        return {**self.backend.version_info(), "kernel_files": list(self.kernel_files)}

    def execute_model(self, model_path: str, input_data: Any) -> Capture:
        """Run the model at ``model_path`` on Metal with every checkpoint captured.

        Args:
            model_path: anything ``load_model`` reads (HF directory, ``.safetensors``, ``.zt`` ...).
            input_data: ``ModelInputs``, a mapping with ``input_ids`` (and ``attention_mask``,
                ``token_type_ids``), or a ``[batch, length]`` array of token ids.
        """
        if not self.initialized:
            self.initialize()
        key = str(model_path)
        if key not in self._loaded:
            model = load_model(model_path)
            self.backend.prepare(model, "float32")
            self._loaded = {key: model}  # one model at a time
        return self.backend.run(_as_inputs(input_data))

    def cleanup(self) -> bool:
        """Drop the model and MLX's cached Metal buffers. Returns True."""
        self._loaded.clear()
        self.backend.net = None
        self.backend.model = None
        if self.initialized:
            import mlx.core as mx

            clear = getattr(mx, "clear_cache", None) or getattr(mx.metal, "clear_cache", None)
            if clear is not None:
                clear()
        self.initialized = False
        return True


def _as_inputs(data: Any) -> ModelInputs:
    if isinstance(data, ModelInputs):
        return data
    if isinstance(data, dict):
        if "input_ids" not in data:
            raise ConfigurationError(f"input_data is a dict without 'input_ids' (keys: {', '.join(map(str, data)) or 'none'})",
                                     hint="pass {'input_ids': [[...]], 'attention_mask': [[...]]}, ModelInputs, "
                                          "or an integer [batch, length] array")
        ids = np.asarray(data["input_ids"])
        mask = np.asarray(data.get("attention_mask", np.ones_like(ids)))
        tt = data.get("token_type_ids")
        return ModelInputs(ids, mask, None if tt is None else np.asarray(tt))
    ids = np.asarray(data)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigurationError("input_data must be ModelInputs, a dict with input_ids, or an integer [batch, length] array")
    return ModelInputs(ids, np.ones_like(ids))
