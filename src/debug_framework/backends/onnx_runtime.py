"""``onnxruntime``: the Hugging Face model exported with ``torch.onnx.export(dynamo=True)``, every
checkpoint an extra graph output, run by ONNX Runtime (CPU provider; CUDA's where present).

The exported ``.onnx`` file is an artifact of the run: it is written under ``artifact_dir``
(default: a new temporary directory, reported in ``version_info()`` and in each ``Capture.meta``),
never into the package or the current directory. Batch and sequence length are dynamic axes, so
one export serves every input shape.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..capture.keys import Capture, CheckpointKey
from ..errors import BackendInitializationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from ._graph_capture import CheckpointOutputs, PlainOutput, graph_inputs, layer_inputs_from, replay_arguments
from .base import BaseBackend, Taps, cpu_name
from .pytorch import build_hf_model

__all__ = ["OnnxRuntimeBackend", "OPTIMIZATION_LEVELS"]

#: ``optimization=`` value -> name of ONNX Runtime's ``GraphOptimizationLevel`` member.
OPTIMIZATION_LEVELS: dict[str, str] = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "disable": "ORT_DISABLE_ALL",
}


class OnnxRuntimeBackend(BaseBackend):
    """ONNX Runtime on an exported graph; float32.

    Args:
        device: ``"cpu"`` (CPUExecutionProvider), ``"cuda"`` (CUDAExecutionProvider, CPU as
            fallback for unsupported nodes) or ``None``: CUDA where ONNX Runtime has it, else CPU.
        artifact_dir: where the exported ``.onnx`` files go; ``None``: a fresh temporary directory.
        opset: ONNX opset for the exporter (``None``: the exporter's default).
        optimization: ONNX Runtime graph optimisation level: ``"all"`` (default), ``"extended"``,
            ``"basic"`` or ``"disable"``.
    """

    name = "onnxruntime"
    supported_dtypes = ("float32",)

    def __init__(self, device: str | None = None, artifact_dir: str | Path | None = None, opset: int | None = None,
                 optimization: str = "all") -> None:
        super().__init__()
        if optimization not in OPTIMIZATION_LEVELS:
            raise BackendInitializationError(
                f"unknown graph optimisation level {optimization!r}",
                hint=f"use one of {', '.join(OPTIMIZATION_LEVELS)}",
                backend=self.name,
            )
        self._device_request = device
        self.device = device or "cpu"
        self.artifact_dir = None if artifact_dir is None else Path(artifact_dir)
        self.opset = opset
        self.optimization = optimization
        self.net: torch.nn.Module | None = None
        self.session: Any = None
        self._plain_session: Any = None
        self.onnx_path: Path | None = None
        self.export_s = 0.0
        self._keys_out: list[Any] = []
        self._wrapper: CheckpointOutputs | None = None
        self._sink: list[torch.Tensor] = []
        self._layer_sessions: dict[tuple[Any, ...], tuple[Any, Path, list[CheckpointKey]]] = {}

    # -- availability and versions -----------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
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
        if self.device.startswith("cuda"):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def version_info(self) -> dict[str, Any]:
        import onnx
        import onnxruntime as ort
        import onnxscript

        used = self.session.get_providers() if self.session is not None else self._providers()
        device_name = cpu_name()
        if self.device.startswith("cuda") and torch.cuda.is_available():
            device_name = torch.cuda.get_device_name(0)
        return {
            **super().version_info(),
            "runtime": "onnxruntime",
            "onnxruntime": ort.__version__,
            "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__,
            "torch": torch.__version__,
            "providers": list(used),
            "device_name": device_name,
            "artifact_dir": None if self.artifact_dir is None else str(self.artifact_dir),
            "onnx_path": None if self.onnx_path is None else str(self.onnx_path),
            "export_s": round(self.export_s, 4),
        }

    # -- export --------------------------------------------------------------------------------------
    def _export(self, module: torch.nn.Module, model: LoadedModel, path: Path, output_names: list[str]) -> float:
        """Export ``module`` with dynamic batch and length (example 2 x 8: no 0/1 specialisation)."""
        from torch.export import Dim

        example = ModelInputs.random(model.config.vocab_size, batch=2, length=8, seed=0, pad_lengths=[0, 2])
        kwargs = {k: torch.from_numpy(v) for k, v in graph_inputs(model, example).items()}
        batch, length = Dim.DYNAMIC, Dim.DYNAMIC
        start = time.perf_counter()
        try:
            with torch.no_grad():
                torch.onnx.export(
                    module, (), str(path), kwargs=kwargs, dynamo=True, opset_version=self.opset,
                    input_names=list(kwargs), output_names=output_names,
                    dynamic_shapes={k: {0: batch, 1: length} for k in kwargs}, verbose=False,
                )
        except Exception as exc:
            raise BackendInitializationError(f"torch.onnx export failed: {exc}", backend=self.name) from exc
        return time.perf_counter() - start

    def _session(self, path: Path) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[self.optimization])
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=self._providers())
        except Exception as exc:
            raise BackendInitializationError(f"ONNX Runtime could not load {path}: {exc}", backend=self.name) from exc

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        """Export the model with every checkpoint as an output and open an ONNX Runtime session."""
        if device is not None:
            self._device_request = device
        if self._device_request is None:
            import onnxruntime as ort

            self._device_request = "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
        self.device = self._device_request
        dtype = self._check_prepare(model, dtype, self.device)
        if self.artifact_dir is None:
            self.artifact_dir = Path(tempfile.mkdtemp(prefix="df-onnx-"))
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        self.net = build_hf_model(model, torch.float32, "cpu")
        wrapper = self._wrapper = CheckpointOutputs.for_model(self.net, model)
        # the list the checkpoint hooks append to (torch.export puts a copy on the wrapper afterwards)
        self._sink = wrapper._sink
        self._keys_out = list(wrapper.keys)
        self._layer_sessions.clear()
        self._names = {k: str(k).replace(":", "_") for k in self._keys_out}
        self.onnx_path = self.artifact_dir / f"{model.architecture}-{model.digest[:12]}-{dtype}-checkpoints.onnx"
        self.export_s = self._export(wrapper, model, self.onnx_path, list(self._names.values()))
        self.session = self._session(self.onnx_path)
        self._plain_session = None

    def _run_plain(self, inputs: ModelInputs) -> Capture:
        """The model exported without checkpoint outputs (exported on first use, beside the other)."""
        model = self._prepared()
        meta: dict[str, Any] = {"variant": "plain"}
        if self._plain_session is None:
            path = self.onnx_path.with_name(self.onnx_path.name.replace("-checkpoints.onnx", "-plain.onnx"))
            meta["export_s"] = self._export(PlainOutput(self.net), model, path, ["output"])
            self._plain_session = self._session(path)
            meta["onnx_path"] = str(path)
        feeds = graph_inputs(model, inputs)
        start = time.perf_counter()
        self._plain_session.run(None, feeds)
        return Capture(backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start, meta=meta)

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        """Fetch the requested checkpoint outputs. ``taps=[]`` runs the plain export (no checkpoints)."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        if not keys and not capture_layer_inputs:
            return self._run_plain(inputs)
        model = self._prepared()
        wanted = set(keys)
        if capture_layer_inputs:
            wanted |= {k for k in self._keys_out if k.name in ("post_embedding", "post_mlp")}
        fetch = [k for k in self._keys_out if k in wanted]
        feeds = graph_inputs(model, inputs)
        start = time.perf_counter()
        arrays = self.session.run([self._names[k] for k in fetch], feeds)
        elapsed = time.perf_counter() - start
        got = dict(zip(fetch, arrays))
        return Capture(
            tensors={k: got[k] for k in keys},
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=elapsed,
            layer_inputs=layer_inputs_from(got, model.num_layers) if capture_layer_inputs else {},
            meta={"variant": "captured", "onnx_path": str(self.onnx_path), "providers": self.session.get_providers()},
        )

    def run_layer(self, i: int, hidden_in: Any, inputs: ModelInputs) -> Capture:
        """Replay layer ``i`` in ONNX Runtime on ``hidden_in`` (isolation).

        The layer's other inputs (attention mask, rotary position embeddings ...) are what the model
        passes it for ``inputs`` (an eager forward stopped as the layer is entered). The layer alone,
        with its checkpoints as outputs, is exported once per layer and input shape (beside the
        model's export, ``...-layer<i>-<shape>.onnx``) and run by ONNX Runtime with ``hidden_in`` as
        its hidden state.
        """
        model = self._prepared()
        hidden = torch.as_tensor(hidden_in).detach().to("cpu", torch.float32)
        layer_name, layer, args, kwargs = replay_arguments(self.net, model, i, inputs, hidden, self._sink, "cpu", self.name)
        leaves, spec = _flatten((args, kwargs))
        leaves = [t.clone() for t in leaves]  # normal tensors: the eager run made inference-mode ones
        key = (i, tuple((tuple(t.shape), t.dtype) for t in leaves))
        meta: dict[str, Any] = {"variant": f"layer {i}", "exported_in_this_call": key not in self._layer_sessions}
        if key not in self._layer_sessions:
            keys = self._wrapper.keys_within(layer_name)
            shape = "x".join(str(d) for d in hidden.shape)
            path = self.onnx_path.with_name(self.onnx_path.name.replace("-checkpoints.onnx", f"-layer{i}-{shape}.onnx"))
            replay = _LayerReplay(layer, self._sink, spec).eval()
            start = time.perf_counter()
            try:
                with torch.no_grad():
                    torch.onnx.export(replay, tuple(leaves), str(path), dynamo=True, opset_version=self.opset,
                                      input_names=[f"in_{n}" for n in range(len(leaves))],
                                      output_names=[str(k).replace(":", "_") for k in keys], verbose=False)
            except Exception as exc:
                raise BackendInitializationError(f"torch.onnx export of layer {i} failed: {exc}", backend=self.name) from exc
            finally:
                self._sink.clear()
            meta["export_s"] = time.perf_counter() - start
            self._layer_sessions[key] = (self._session(path), path, keys)
        session, path, keys = self._layer_sessions[key]
        wanted = [k for k in keys if k in (CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i))]
        names = {inp.name for inp in session.get_inputs()}  # the exporter drops inputs the graph does not use
        feeds = {f"in_{n}": t.numpy() for n, t in enumerate(leaves) if f"in_{n}" in names}
        start = time.perf_counter()
        arrays_out = session.run([str(k).replace(":", "_") for k in wanted], feeds)
        elapsed = time.perf_counter() - start
        return Capture(tensors=dict(zip(wanted, arrays_out, strict=True)), backend=self.name, dtype=self.dtype,
                       elapsed_s=elapsed, meta={**meta, "onnx_path": str(path)})


class _LayerReplay(torch.nn.Module):
    """One layer called with the arguments rebuilt from flat tensors (``spec``: see :func:`_flatten`);
    returns what the checkpoint hooks inside it appended to ``sink``, in firing order."""

    def __init__(self, layer: torch.nn.Module, sink: list[torch.Tensor], spec: Any) -> None:
        super().__init__()
        self.layer = layer
        self._sink = sink
        self._spec = spec

    def forward(self, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = _unflatten(self._spec, list(leaves))
        self._sink.clear()
        self.layer(*args, **kwargs)
        out = tuple(self._sink)
        self._sink.clear()
        return out


_LEAF = object()


def _flatten(value: Any) -> tuple[list[torch.Tensor], Any]:
    """The tensors in nested tuples/lists/dicts, in order, and a spec of everything else."""
    leaves: list[torch.Tensor] = []

    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            leaves.append(v)
            return _LEAF
        if isinstance(v, (tuple, list)):
            return (type(v), [walk(x) for x in v])
        if isinstance(v, dict):
            return (dict, {k: walk(x) for k, x in v.items()})
        return ("const", v)

    return leaves, walk(value)


def _unflatten(spec: Any, leaves: list[torch.Tensor]) -> Any:
    it = iter(leaves)

    def build(sp: Any) -> Any:
        if sp is _LEAF:
            return next(it)
        kind, body = sp
        if kind == "const":
            return body
        if kind is dict:
            return {k: build(x) for k, x in body.items()}
        return kind(build(x) for x in body)

    return build(spec)
