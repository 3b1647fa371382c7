"""``onnxruntime``: the Hugging Face model exported with ``torch.onnx.export(dynamo=True)``, every
checkpoint an extra graph output (or an ONNX file as it is), run by ONNX Runtime (CPU provider;
CUDA's where present). The export, the checkpoints and the layer cuts are every ONNX-graph engine's
(:class:`~debug_framework.backends._onnx_export.OnnxGraphBackend`); this module is ONNX Runtime's
part: its sessions, its graph optimisation levels, its availability and versions.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BackendInitializationError
from .._onnx_export import LAYER_REPLAYS, GraphSession, LayerExport, OnnxGraphBackend
from .._onnx_file import load_error
from .._onnx_graph import EXPORT_LOG
from ..base import cpu_name, installed_version
from .sessions import without_model_bytes

if TYPE_CHECKING:
    from ...jsonio import JsonObject

__all__ = ["OnnxRuntimeBackend", "OPTIMIZATION_LEVELS", "LAYER_REPLAYS", "LayerExport"]

#: ``optimization=`` value -> name of ONNX Runtime's ``GraphOptimizationLevel`` member.
OPTIMIZATION_LEVELS: dict[str, str] = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "disable": "ORT_DISABLE_ALL",
}


class OnnxRuntimeBackend(OnnxGraphBackend):
    """ONNX Runtime on an exported graph (or an ONNX file); float32.

    Args:
        device: ``"cpu"`` (CPUExecutionProvider), ``"cuda"`` (CUDAExecutionProvider, CPU as
            fallback for unsupported nodes) or ``None``: CUDA where ONNX Runtime has it, else CPU.
        optimization: ONNX Runtime graph optimisation level: ``"all"`` (default), ``"extended"``,
            ``"basic"`` or ``"disable"``.
        artifact_dir, opset, layer_replay, graph_transform, model_file: as for
            :class:`~debug_framework.backends._onnx_export.OnnxGraphBackend`.
    """

    name = "onnxruntime"

    def __init__(self, device: str | None = None, artifact_dir: str | Path | None = None, opset: int | None = None,
                 optimization: str = "all", layer_replay: str = "graph", graph_transform: str | None = None,
                 model_file: str | Path | None = None) -> None:
        if optimization not in OPTIMIZATION_LEVELS:
            raise BackendInitializationError(f"unknown graph optimisation level {optimization!r}",
                                             hint=f"use one of {', '.join(OPTIMIZATION_LEVELS)}", backend=self.name)
        super().__init__(device=device, artifact_dir=artifact_dir, opset=opset, layer_replay=layer_replay,
                         graph_transform=graph_transform, model_file=model_file)
        self.optimization = optimization

    def availability(self) -> tuple[bool, str]:
        """Whether ONNX Runtime and the exporter's packages are here (and CUDA's provider, when asked for)."""
        try:
            import onnxruntime as ort
        except ImportError as exc:
            return False, f"onnxruntime is not installed: {exc}"
        import importlib.util

        for needed in ("onnx", "onnxscript"):  # the dynamo exporter needs both (found, not imported: slow)
            if importlib.util.find_spec(needed) is None:
                return False, f"{needed} (needed by torch.onnx's dynamo exporter) is not installed"
        if self._device_request and self._device_request.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                return False, (f"device {self._device_request!r} requested but this onnxruntime {ort.__version__} has no "
                               f"CUDAExecutionProvider (providers: {', '.join(ort.get_available_providers())})")
        return True, ""

    def _providers(self) -> list[str]:
        """The execution providers of this backend's sessions: CUDA's (CPU as fallback) on ``cuda``, else CPU's."""
        if self.device.startswith("cuda"):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def version_info(self) -> JsonObject:
        import onnx
        import onnxruntime as ort

        used = self.session.get_providers() if self.session is not None else self._providers()
        device_name = cpu_name()
        torch = sys.modules.get("torch")  # an ONNX file's run never imports it
        if self.device.startswith("cuda") and torch is not None and torch.cuda.is_available():
            device_name = torch.cuda.get_device_name(0)
        return {
            **super().version_info(),
            "runtime": "onnxruntime",
            "onnxruntime": ort.__version__,
            "onnx": onnx.__version__,
            "onnxscript": installed_version("onnxscript"),
            "torch": installed_version("torch"),
            "providers": list(used),
            "device_name": device_name,
            "artifact_dir": None if self.artifact_dir is None else str(self.artifact_dir),
            "onnx_path": None if self.onnx_path is None else str(self.onnx_path),
            "export_log": None if self.artifact_dir is None else str(self.artifact_dir / EXPORT_LOG),
            "export_s": round(self.export_s, 4),
            "layer_replay": self.layer_replay,
            "graph_transform": self.graph_transform,
        }

    def _default_device(self) -> str:
        """``cuda`` where this ONNX Runtime has the CUDA execution provider, else ``cpu``."""
        import onnxruntime as ort

        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"

    def _session(self, path: Path, graph: bytes | None = None, *, arena: bool = True) -> GraphSession:
        """An ONNX Runtime session on the file ``path``, or on ``graph`` (serialized; external data beside
        ``path``); ``arena=False``: without ONNX Runtime's memory arena (a session run a few times, whose
        largest run's buffers are then not kept for its life)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.enable_cpu_mem_arena = arena
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[self.optimization])
        if self.graph_transform is not None:
            graph = self._transformed(path, graph)
        if graph is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
        try:
            session = ort.InferenceSession(str(path) if graph is None else graph, sess_options=options,
                                           providers=self._providers())
        except Exception as exc:
            source = self.onnx_path if getattr(self, "_file_model", False) else None  # the user's file
            raise load_error(exc, path, graph, self.name, source) from exc
        return without_model_bytes(session)
