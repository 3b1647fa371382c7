"""``mlx`` and ``metal``: the reference's own models (``debug_framework.architectures``, Llama
family and BERT) run over the ``mlx.core`` array namespace: the same step functions as
``python_reference``, with the weights converted to MLX arrays.

``mlx`` runs on the Metal GPU where there is one (Apple silicon) and on the CPU elsewhere.
``metal`` is MLX pinned to the Metal device: available only where Metal is, otherwise
unavailable with the reason. ``metal_path`` (``PIE_METAL_PATH``, passed in by the caller) names an
optional directory of user Metal kernels; it is recorded now and used by the plugin work later.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...architectures import BertReference, LlamaReference, build_reference
from ...capture.keys import Capture, CheckpointKey
from ...errors import BackendInitializationError
from ...modelio.inputs import ModelInputs
from ...modelio.loader import LoadedModel
from ..base import BaseBackend, HiddenState, Taps, Tensor, cpu_name
from .xp import mlx_namespace

if TYPE_CHECKING:
    import mlx.core as mx

    from ...jsonio import JsonObject

__all__ = ["MLXBackend", "MLXMetalBackend", "mlx_availability", "metal_availability"]


def mlx_availability() -> tuple[bool, str]:
    """Whether ``mlx.core`` imports here."""
    try:
        import mlx.core  # noqa: F401
    except ImportError as exc:
        return False, f"mlx is not installed: {exc} (pip install mlx; Linux wheels are CPU-only)"
    except Exception as exc:  # a broken native library
        return False, f"mlx failed to load: {exc}"
    return True, ""


def metal_availability() -> tuple[bool, str]:
    """Whether MLX sees a Metal device (Apple silicon with macOS)."""
    ok, reason = mlx_availability()
    if not ok:
        return ok, reason
    import mlx.core as mx

    if not mx.metal.is_available():
        return False, (f"Metal is not available on this machine ({platform.system()} {platform.machine()}); "
                       f"mlx {_mlx_version()} runs on the CPU here: use the 'mlx' backend, or run on Apple silicon")
    return True, ""


def _mlx_version() -> str:
    try:
        from importlib.metadata import version

        return version("mlx")
    except Exception:  # pragma: no cover
        import mlx.core as mx

        return getattr(mx, "__version__", "unknown")


def _host(x: mx.array) -> Tensor:
    """An MLX array as a NumPy array; bfloat16 (which NumPy lacks) as a torch bfloat16 tensor
    (exact: every bfloat16 is a float32)."""
    import mlx.core as mx

    if x.dtype == mx.bfloat16:
        import torch

        return torch.from_numpy(np.array(x.astype(mx.float32), copy=True)).to(torch.bfloat16)
    return np.array(x, copy=True)


def _float32_host(x: HiddenState) -> np.ndarray:
    """A hidden state (a torch tensor or anything NumPy reads) as a float32 NumPy array on the host."""
    return x.detach().cpu().float().numpy() if hasattr(x, "detach") else np.asarray(x, np.float32)


class MLXBackend(BaseBackend):
    """MLX; float32 (default), float16, bfloat16.

    Args:
        device: ``"gpu"`` (Metal), ``"cpu"``, or ``None``: the GPU where Metal is, else the CPU.
        metal_path: directory of user Metal kernels (recorded; used by the plugin work later).
    """

    runs_onnx_files = False
    name = "mlx"
    supported_dtypes = ("float32", "float16", "bfloat16")

    def __init__(self, device: str | None = None, metal_path: str | Path | None = None) -> None:
        super().__init__()
        self._device_request = device
        self.device = device or "auto"
        self.metal_path = None if metal_path is None else Path(metal_path)
        self.net: LlamaReference | BertReference | None = None

    def availability(self) -> tuple[bool, str]:
        ok, reason = mlx_availability()
        if ok and self._device_request in ("gpu", "metal"):
            return metal_availability()
        return ok, reason

    def _resolve_device(self, device: str | None) -> str:
        request = device or self._device_request
        if request in (None, "auto"):
            import mlx.core as mx

            return "gpu" if mx.metal.is_available() else "cpu"
        if request == "metal":
            return "gpu"
        if request not in ("cpu", "gpu"):
            raise BackendInitializationError(f"device {request!r} is not an MLX device", hint="use 'cpu' or 'gpu'", backend=self.name)
        return request

    def version_info(self) -> JsonObject:
        import mlx.core as mx

        info = {**super().version_info(), "runtime": "mlx", "mlx": _mlx_version(),
                "metal_available": bool(mx.metal.is_available()),
                "metal_path": None if self.metal_path is None else str(self.metal_path)}
        device = self.device if self.device in ("cpu", "gpu") else self._resolve_device(None)
        info["device"] = device
        if device == "gpu":
            try:
                info["device_name"] = mx.metal.device_info().get("architecture", "metal gpu")
            except Exception:  # pragma: no cover - Apple only
                info["device_name"] = "metal gpu"
        else:
            info["device_name"] = cpu_name()
        return info

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        """Build the MLX model on ``device`` (``None``: the backend's; ``"cpu"`` / ``"gpu"``)."""
        resolved = self._resolve_device(device)
        if resolved == "gpu":
            ok, reason = metal_availability()
            if not ok:
                raise BackendInitializationError(reason, backend=self.name)
        dtype = self._check_prepare(model, dtype, resolved)
        if model.architecture == "generic":  # MLX runs the models written from the math, not transformers' code
            raise BackendInitializationError(
                f"MLX cannot express model_type {model.config.model_type!r}: the mlx backend runs the models "
                "written from the math (architectures/) over mlx.core, and this model has none "
                f"({getattr(model.config, 'why_generic', '')})",
                hint="compare it with pytorch, inductor, cuda or an ONNX-graph engine (its own transformers code)",
                backend=self.name)
        import mlx.core as mx

        self._mx_device = mx.gpu if resolved == "gpu" else mx.cpu
        with mx.stream(self._mx_device):
            self.net = build_reference(model.config, model.weights, dtype, mlx_namespace())
            mx.eval(self.net.parameters())

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        keys = self._keys(taps)
        self._check_inputs(inputs)
        import mlx.core as mx

        want = {tuple(k) for k in keys}
        if not want and not capture_layer_inputs:  # nothing kept: still evaluate the final output
            want = {("post_processing", None)}
        layer_inputs: dict[int, mx.array] | None = {} if capture_layer_inputs else None
        ids, mask = mx.array(inputs.input_ids), mx.array(inputs.attention_mask)
        tt = None if inputs.token_type_ids is None else mx.array(inputs.token_type_ids)
        with mx.stream(self._mx_device):
            start = time.perf_counter()
            self.net.positions = inputs.position_ids()
            out = self.net.forward(ids, mask, want, layer_inputs, tt)
            mx.eval(list(out.values()) + list((layer_inputs or {}).values()))  # MLX is lazy
            elapsed = time.perf_counter() - start
        return Capture(
            tensors={k: _host(out[tuple(k)]) for k in keys},
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=elapsed,
            layer_inputs={i: _host(v) for i, v in (layer_inputs or {}).items()},
            meta={"device": self.device},
        )

    def _on_device(self, hidden_in: HiddenState, inputs: ModelInputs,
                   step: Callable[[mx.array, mx.array], dict[CheckpointKey, mx.array]]) -> Capture:
        """``step(h, mask)`` on the device, ``h`` the hidden state ``[B, T, D]`` at the model's dtype:
        the values it returns, evaluated and timed, as a capture."""
        self._prepared()
        import mlx.core as mx

        host = _float32_host(hidden_in)
        with mx.stream(self._mx_device):
            h = self.net.xp.from_host(host, self.net.dtype)
            start = time.perf_counter()
            self.net.positions = inputs.position_ids()
            out = step(h, mx.array(inputs.attention_mask))
            mx.eval(list(out.values()))  # MLX is lazy
            elapsed = time.perf_counter() - start
        return Capture(tensors={k: _host(v) for k, v in out.items()}, backend=self.name, dtype=self.dtype,
                       elapsed_s=elapsed)

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Run layer ``i`` alone on ``hidden_in`` ``[B, T, D]``; returns its post_attention and post_mlp."""

        def layer(h: mx.array, mask: mx.array) -> dict[CheckpointKey, mx.array]:
            a, out = self.net.layer(i, h, mask)
            return {CheckpointKey("post_attention", i): a, CheckpointKey("post_mlp", i): out}

        return self._on_device(hidden_in, inputs, layer)

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` (``"attention"`` or ``"mlp"``) of layer ``i`` alone on its input ``[B, T, D]``."""

        def one_block(h: mx.array, mask: mx.array) -> dict[CheckpointKey, mx.array]:
            key, out = self.net.block(i, block, h, mask)
            return {CheckpointKey(*key): out}

        return self._on_device(hidden_in, inputs, one_block)


class MLXMetalBackend(MLXBackend):
    """The spec's ``metal`` backend: MLX on the Metal GPU, nowhere else."""

    name = "metal"

    def __init__(self, metal_path: str | Path | None = None) -> None:
        super().__init__(device="gpu", metal_path=metal_path)

    def availability(self) -> tuple[bool, str]:
        return metal_availability()

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        if device not in (None, "gpu", "metal"):
            raise BackendInitializationError(f"the metal backend runs on the Metal GPU, not {device!r}", backend=self.name)
        super().prepare(model, dtype, "gpu")
