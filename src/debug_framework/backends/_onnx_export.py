"""An engine that runs a Hugging Face model exported with ``torch.onnx.export(dynamo=True)`` (every
checkpoint an extra graph output), or an ONNX file as it is: everything but the runtime, shared by
the engines that run ONNX graphs (each subclasses :class:`OnnxGraphBackend` and opens its sessions,
:meth:`OnnxGraphBackend._session`).

The exported ``.onnx`` file is an artifact of the run, under ``artifact_dir`` (default: the session's artifact
directory, :mod:`debug_framework.backends.artifacts`; else a temporary ``df-onnx-*`` directory removed by
:meth:`OnnxGraphBackend.close`), reported in ``version_info()`` and each ``Capture.meta``, with the exporter's
``export.log``. Batch and length are dynamic. An ONNX file (:mod:`debug_framework.modelio.onnx_file`) runs as it is.

Isolation (``run_layer``) replays a layer from that same export: the graph is cut at the layer's boundaries (its
input and its checkpoints are named graph outputs), so nothing is exported again; ``run_block(i, "mlp", ...)``
replays a layer's MLP block alone, cut from ``post_attention:i`` to ``post_mlp:i``.
"""

from __future__ import annotations

import sys
import time
import weakref
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..capture.keys import Capture, CheckpointKey, layer_input_key
from ..errors import BackendInitializationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from ._graph_session import GraphPort, GraphSession, LayerExport
from ._graph_feeds import check_layer_index, graph_inputs, layer_inputs_from
from ._onnx_file import alternative_model, checkpoint_graph, checkpoint_proto, weights_dtype
from ._onnx_graph import EXPORT_LOG, LayerCutError, captured_output, cut_layer
from .artifacts import run_directory
from .base import BaseBackend, HiddenState, Taps, attention_block_or_mlp_checked

if TYPE_CHECKING:  # torch is imported where a torch model is exported: an ONNX file is run without it
    import onnx
    import torch

    from ..jsonio import JsonObject
    from ._graph_capture import CheckpointOutputs

__all__ = ["OnnxGraphBackend", "GraphSession", "GraphPort", "LayerExport", "LAYER_REPLAYS"]

#: ``layer_replay=`` values: how ``run_layer`` gets a layer's graph.
LAYER_REPLAYS: dict[str, str] = {
    "graph": "cut out of the model's export (no second export)",
    "export": "the layer exported alone, once per layer and input shape (slow; kept for comparison)",
}


class OnnxGraphBackend(BaseBackend):
    """An engine running ONNX graphs: a Hugging Face model's export, or an ONNX file; float32.

    A subclass is one engine: it names itself (``name``), says whether its runtime is here
    (:meth:`availability`, :meth:`version_info`) and opens a session on a graph
    (:meth:`_session`); everything else (the export, the checkpoint outputs, the layer and block
    cuts, :meth:`export_layer` for the node-level drill-down) is here.

    Args:
        device: the engine's device (``None``: :meth:`_default_device` when prepared).
        artifact_dir: where the exported ``.onnx`` files and ``export.log`` go; ``None``: the
            session's artifact directory during a validation, else a temporary directory that
            :meth:`close` (or garbage collection, or interpreter exit) removes.
        opset: ONNX opset for the exporter (``None``: the exporter's default).
        layer_replay: how :meth:`run_layer` builds a layer's graph: ``"graph"`` (default: cut out of
            the model's export) or ``"export"`` (the layer exported alone, the slow former way).
        model_file: ``--alternative-model``: an ONNX file of the same model (float16-converted,
            optimised, quantized) run instead of the session's model, its checkpoints matched by
            tensor name; the session's model must then be an ONNX file too.
        graph_transform: ``"module:function"`` or ``"path/file.py:function"``, a function
            ``(onnx.ModelProto) -> onnx.ModelProto`` applied to every graph before the runtime loads
            it (a deployment's own graph surgery: fusions, rewrites); ``None``: graphs as exported.
    """

    supported_dtypes = ("float32",)

    def declared_dtype(self, model: LoadedModel) -> tuple[str, str] | None:
        """The precision the file this backend runs computes at (``--dtype auto``): its weights'
        floating type, for an ONNX-file model or ``model_file``; None for an export of ours (float32)."""
        path = self.model_file or (Path(model.path) if getattr(model, "format", None) == "onnx" else None)
        if path is None:
            return None
        found = weights_dtype(path)
        return None if found is None else (found, f"the weights of {path.name} are {found}")

    def __init__(self, device: str | None = None, artifact_dir: str | Path | None = None, opset: int | None = None,
                 layer_replay: str = "graph", graph_transform: str | None = None,
                 model_file: str | Path | None = None) -> None:
        super().__init__()
        self.model_file = alternative_model(model_file, self.name)
        if self.model_file is not None:  # the file's precision is its own: the dtype is the one it is judged at
            self.supported_dtypes = ("float32", "float16", "bfloat16")
        if layer_replay not in LAYER_REPLAYS:
            raise BackendInitializationError(f"unknown layer replay {layer_replay!r}",
                                             hint=f"use one of {', '.join(LAYER_REPLAYS)}", backend=self.name)
        self.layer_replay = layer_replay
        self.graph_transform = graph_transform
        self._transform: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None
        self._device_request = device
        self.device = device or "cpu"
        self.artifact_dir = None if artifact_dir is None else Path(artifact_dir)
        self.opset = opset
        self.net: torch.nn.Module | None = None
        self.session: GraphSession | None = None
        self._plain_session: GraphSession | None = None
        self.onnx_path: Path | None = None
        self.export_s = 0.0
        self._keys_out: list[CheckpointKey] = []
        self._wrapper: CheckpointOutputs | None = None
        self._sink: list[torch.Tensor] = []
        self._layer_sessions: dict[tuple[object, ...], tuple[GraphSession, Path, list[CheckpointKey]]] = {}
        #: (layer, "layer" | "mlp") -> an session on that cut of the export, its hidden input's name
        self._cut_sessions: dict[tuple[int, str], tuple[GraphSession, str]] = {}
        self._cut_failed: dict[int, str] = {}
        self._block_support: tuple[bool, str] | None = None
        self._graph_proto: onnx.ModelProto | None = None
        self._file_model = False  # an ONNX-file model (modelio/onnx_file.py): the file is run, nothing exported
        #: removes the temporary artifact directory (None: the directory is not this backend's to remove)
        self._temporary: weakref.finalize | None = None

    # -- the engine's part ---------------------------------------------------------------------------
    def _session(self, path: Path, graph: bytes | None = None, *, arena: bool = True) -> GraphSession:
        """A session of this engine on the file ``path``, or on ``graph`` (serialized; external data
        beside ``path``), with :attr:`graph_transform` applied; ``arena=False``: a session run a few
        times (the runtime need not keep its largest run's buffers). The engine's subclass opens it."""
        raise NotImplementedError(f"{type(self).__name__} does not open sessions")

    def _default_device(self) -> str:
        """The device :meth:`prepare` uses when none was asked for (the engine's subclass may look)."""
        return "cpu"

    # -- export --------------------------------------------------------------------------------------
    def _export(self, module: torch.nn.Module, model: LoadedModel, path: Path, output_names: list[str]) -> float:
        """Export ``module`` with dynamic batch and length (example 2 x 8: no 0/1 specialisation)."""
        import torch
        import torch.onnx  # before the output is captured: importing it gives its logger a stderr handler
        from torch.export import Dim

        example = ModelInputs.random(model.config.vocab_size, batch=2, length=8, seed=0, pad_lengths=[0, 2])
        kwargs = {k: torch.from_numpy(v) for k, v in graph_inputs(model, example).items()}
        batch, length = Dim.DYNAMIC, Dim.DYNAMIC
        start = time.perf_counter()
        try:
            with torch.no_grad(), captured_output(path.with_name(EXPORT_LOG), f"export of {path.name}"):
                torch.onnx.export(
                    module, (), str(path), kwargs=kwargs, dynamo=True, opset_version=self.opset,
                    input_names=list(kwargs), output_names=output_names,
                    dynamic_shapes={k: {0: batch, 1: length} for k in kwargs}, verbose=False,
                )
        except Exception as exc:
            raise BackendInitializationError(f"torch.onnx export failed: {exc}", backend=self.name,
                                             hint=f"the exporter's output is in {path.with_name(EXPORT_LOG)}") from exc
        return time.perf_counter() - start

    def open_session(self, graph: bytes, beside: Path) -> GraphSession:
        """A session on ``graph`` (serialized; external data beside ``beside``) opened as this
        backend opens its own (providers, optimisation level, ``graph_transform``): the drill-down's."""
        return self._session(beside, graph, arena=False)

    def open_session_file(self, path: Path) -> GraphSession:
        """:meth:`open_session` on the ONNX file ``path``, read by the runtime itself: no serialized
        copy of the graph is held (nor copied again by the binding) while the session is built."""
        return self._session(path, arena=False)

    def _transformed(self, path: Path, graph: bytes | None) -> bytes:
        """``graph`` (or the file ``path``, its external data left where it is) after :attr:`graph_transform`."""
        import onnx

        from ._user_function import load_user_function

        if self._transform is None:
            self._transform = load_user_function(self.graph_transform, self.name, "graph_transform")
        proto = onnx.load_from_string(graph) if graph is not None else onnx.load(str(path), load_external_data=False)
        try:
            return self._transform(proto).SerializeToString()
        except Exception as exc:
            raise BackendInitializationError(f"graph_transform {self.graph_transform!r} failed on {path.name}: {exc}",
                                             backend=self.name) from exc

    def _artifact_dir(self) -> Path:
        """The directory for this run's files: the one given, else the session's (claimed under the
        current artifact root), else a temporary ``df-onnx-*`` directory this backend removes."""
        if self._temporary is None:  # not yet a temporary directory of its own: the given, claimed or a new one
            self.artifact_dir, self._temporary = run_directory(self, self.artifact_dir, self.name, "df-onnx-")
        return self.artifact_dir

    def release_replays(self) -> None:
        """Drop the layer cuts' sessions and an ONNX file's graph they are cut from (built again on need)."""
        self._cut_sessions.clear()
        self._graph_proto = None if getattr(self, "_file_model", False) else self._graph_proto

    def close(self) -> None:
        """Drop the sessions and remove the temporary artifact directory, if this
        backend made one (a directory given to it, or the session's, is kept). Prepare again to reuse."""
        self.session = self._plain_session = self._graph_proto = None
        self._layer_sessions.clear()
        self._cut_sessions.clear()
        self._cut_failed.clear()
        self._block_support = None
        self.model = None
        if self._temporary is not None:
            self._temporary()
            self._temporary, self.artifact_dir = None, None

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        """Export the model with every checkpoint as an output and open an session."""
        if device is not None:
            self._device_request = device
        if self._device_request is None:
            self._device_request = self._default_device()
        self.device = self._device_request
        declared = self.declared_dtype(model)
        if declared is not None and declared[0] not in self.supported_dtypes:  # the file's precision is its own
            self.supported_dtypes = (*self.supported_dtypes, declared[0])
        dtype = self._check_prepare(model, dtype, self.device)
        artifact_dir = self._artifact_dir()
        if self.model_file is not None and getattr(model, "format", None) != "onnx":
            raise BackendInitializationError("an alternative model file needs an ONNX file as the session's model",
                                             backend=self.name, hint="pass the original .onnx file as --model-path")
        if getattr(model, "format", None) == "onnx":
            self._prepare_file(model, artifact_dir)
            return
        self._file_model = False
        import torch

        from ._graph_capture import CheckpointOutputs
        from .pytorch import build_hf_model

        self.net = build_hf_model(model, torch.float32, "cpu")
        wrapper = self._wrapper = CheckpointOutputs.for_model(self.net, model)
        # the list the checkpoint hooks append to (torch.export puts a copy on the wrapper afterwards)
        self._sink = wrapper._sink
        self._keys_out = list(wrapper.keys)
        self._layer_sessions.clear()
        self._cut_sessions.clear()
        self._cut_failed.clear()
        self._block_support = None
        self._graph_proto = None
        self._names = {k: str(k).replace(":", "_") for k in self._keys_out}
        self.onnx_path = artifact_dir / f"{model.architecture}-{model.digest[:12]}-{dtype}-checkpoints.onnx"
        self.export_s = self._export(wrapper, model, self.onnx_path, list(self._names.values()))
        self.session = self._session(self.onnx_path)
        self._plain_session = None

    def can_decode(self) -> tuple[bool, str]:  # the graph takes the whole sequence at once
        return False, "runs an ONNX export with no past key/values (no KV-cache inputs or outputs) to decode through"

    def _prepare_file(self, model: LoadedModel, artifact_dir: Path) -> None:
        """An ONNX-file model: the file itself (or ``model_file``), its checkpoint tensors made
        outputs (:func:`~._onnx_file.file_outputs`); nothing exported."""

        from ._onnx_file import file_outputs

        self._file_model = True
        self.net, self._wrapper, self._graph_proto = None, None, None
        self._layer_sessions.clear()
        self._cut_sessions.clear()
        path, self._names = file_outputs(model, self.model_file)
        self._keys_out, self.onnx_path, self.export_s = list(self._names), path, 0.0
        graph = checkpoint_graph(path, list(self._names.values()))
        self._graph_proto = None  # what isolation cuts each layer out of (_cut): read there, on need
        self.session = self._session(artifact_dir / f"{path.stem}-checkpoints.onnx", graph)
        self._plain_session = self.session

    def release_session(self) -> None:
        """An ONNX-file model: drop the checkpoint graph's session (opened again by the next run), so
        that a stage opening its own session on the file (mark-all) does not hold its weights twice."""
        if getattr(self, "_file_model", False):
            self.session = self._plain_session = None

    def _checkpoint_session(self) -> GraphSession:
        """The checkpoint graph's session (an ONNX-file model's opened again after :meth:`release_session`)."""
        if self.session is None and getattr(self, "_file_model", False):
            graph = checkpoint_graph(self.onnx_path, list(self._names.values()))
            self.session = self._plain_session = self._session(
                self._artifact_dir() / f"{self.onnx_path.stem}-checkpoints.onnx", graph)
        return self.session

    def _run_plain(self, inputs: ModelInputs) -> Capture:
        """The model exported without checkpoint outputs (exported on first use, beside the other)."""
        model = self._prepared()
        meta: JsonObject = {"variant": "plain"}
        if getattr(self, "_file_model", False):
            feeds = graph_inputs(model, inputs)
            start = time.perf_counter()
            session = self._checkpoint_session()
            session.run([session.get_outputs()[0].name], feeds)
            return Capture(backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start, meta=meta)
        if self._plain_session is None:
            from ._graph_capture import PlainOutput

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
        arrays = self._checkpoint_session().run([self._names[k] for k in fetch], feeds)
        elapsed = time.perf_counter() - start
        got = dict(zip(fetch, arrays))
        return Capture(
            tensors={k: got[k] for k in keys if k in got},  # an ONNX file may lack a checkpoint
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=elapsed,
            layer_inputs=layer_inputs_from(got, model.num_layers) if capture_layer_inputs else {},
            meta={"variant": "captured", "onnx_path": str(self.onnx_path), "providers": self.session.get_providers()},
        )

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Replay layer ``i`` in the engine on ``hidden_in`` (isolation).

        ``layer_replay="graph"`` (default): the layer's part of the model's export, cut at its
        boundaries (:func:`~debug_framework.backends._onnx_graph.cut_layer`): ``hidden_in`` feeds
        the value the layer reads, and its masks and positions are computed from ``inputs`` by the
        same nodes as in the full graph. Built in memory once per layer (any input shape), nothing
        exported or written. Where the graph cannot be cut so, the layer is exported alone instead
        and ``meta["cut_failed"]`` says why.

        ``layer_replay="export"``: the layer alone exported once per layer and input shape
        (``...-layer<i>-<shape>.onnx``), its other arguments from an eager forward stopped at the layer.
        ``Capture.meta``: ``replay``, ``built_in_this_call`` (``build_s``), ``onnx_path``.
        """
        model = self._prepared()
        check_layer_index(model, i, self.name)
        hidden = _float32(hidden_in)
        cut_failed = self._cut_failed.get(i)
        if self.layer_replay == "graph" and cut_failed is None:
            try:
                return self._run_cut(i, "layer", hidden, inputs)
            except LayerCutError as exc:
                cut_failed = self._cut_failed[i] = str(exc)
        cap = self._run_exported_layer(i, hidden, inputs)
        if cut_failed is not None:
            cap.meta["cut_failed"] = cut_failed
        return cap

    def can_run_block(self) -> tuple[bool, str]:
        """A layer's MLP block runs alone where the export can be cut from each layer's
        ``post_attention`` to its ``post_mlp`` (checked once per prepare, without running anything)."""
        structure = getattr(self._wrapper, "structure", None)
        if self._block_support is None and structure is not None and any(layer.parallel for layer in structure.layers):
            self._block_support = (False, "runs attention and MLP in parallel: the MLP is judged with the whole layer")
        if self._block_support is None:
            model = self._prepared()
            self._block_support = (True, "")
            for i in range(model.num_layers):
                try:
                    self._cut(i, "mlp")
                except LayerCutError as exc:
                    self._block_support = (False, f"cannot cut layer {i}'s MLP block out of its export: {exc}")
                    break
        return self._block_support

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` of layer ``i`` in the engine, on that block's own input.

        ``"mlp"``: the model's export cut from ``post_attention:i`` (fed ``hidden_in``, the
        post-attention state) to ``post_mlp:i`` (see :meth:`can_run_block`), built in memory once per
        layer like :meth:`run_layer`'s cuts; ``Capture.meta`` as there. ``"attention"``:
        :meth:`run_layer` on the layer's input, its ``post_attention:i``.

        Raises:
            BackendInitializationError: the export cannot be cut so (DF002).
        """
        attention = attention_block_or_mlp_checked(self, i, hidden_in, inputs, block)
        if attention is not None:
            return attention
        return self._run_cut(i, "mlp", _float32(hidden_in), inputs)

    def _run_cut(self, i: int, part: str, hidden: np.ndarray, inputs: ModelInputs) -> Capture:
        """Layer ``i`` (``part="layer"``) or its MLP block (``"mlp"``) replayed by its cut of the
        model's graph (raises LayerCutError where there is none)."""
        model = self._prepared()
        keys = self._cut_keys(i, part)
        built = (i, part) not in self._cut_sessions
        variant = f"layer {i}" if part == "layer" else f"mlp block {i}"
        meta: JsonObject = {"variant": variant, "replay": "graph", "built_in_this_call": built}
        if built:
            start = time.perf_counter()
            for other in [k for k in self._cut_sessions if k[0] != i]:  # one layer's cuts held at a time
                del self._cut_sessions[other]
            cut = self._cut(i, part)
            session = self._session(self.onnx_path, cut.SerializeToString())
            self._cut_sessions[(i, part)] = (session, cut.graph.input[0].name)
            meta["build_s"] = time.perf_counter() - start
        session, hidden_name = self._cut_sessions[(i, part)]
        names = {inp.name for inp in session.get_inputs()}  # the cut keeps only the graph inputs it reads
        feeds = {k: v for k, v in graph_inputs(model, inputs).items() if k in names}
        typed = next((x.type for x in session.get_inputs() if x.name == hidden_name), "")  # a float16 file's: float16
        feeds[hidden_name] = np.ascontiguousarray(hidden.astype(np.float16 if "float16" in typed else np.float32))
        start = time.perf_counter()
        arrays = session.run([self._names[k] for k in keys], feeds)
        elapsed = time.perf_counter() - start
        return Capture(tensors=dict(zip(keys, arrays, strict=True)), backend=self.name, dtype=self.dtype,
                       elapsed_s=elapsed, meta={**meta, "onnx_path": str(self.onnx_path)})

    def _cut_keys(self, i: int, part: str) -> list[CheckpointKey]:
        """The checkpoints the cut ``part`` of layer ``i`` computes."""
        if part == "mlp":
            return [CheckpointKey("post_mlp", i)]
        return [k for k in (CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)) if k in self._names]

    def _cut(self, i: int, part: str) -> onnx.ModelProto:
        """The cut of the model's export (an ``onnx.ModelProto``, weights left in the data file) that
        replays layer ``i`` (``part="layer"``: from its input) or its MLP block (``"mlp"``: from its
        ``post_attention``); its first graph input is the hidden state (see :func:`cut_layer`)."""
        import onnx

        if self._graph_proto is None:  # an ONNX file's checkpoint graph (released), else the export without weights
            self._graph_proto = (checkpoint_proto(self.onnx_path, list(self._names.values())) if getattr(
                self, "_file_model", False) else onnx.load(str(self.onnx_path), load_external_data=False))
        start = CheckpointKey("post_attention", i) if part == "mlp" else layer_input_key(i)
        if start not in self._names:  # a graph whose layers have no post_attention boundary
            raise LayerCutError(f"the graph has no {start} checkpoint to cut layer {i}'s {part} from")
        return cut_layer(self._graph_proto, self._names[start], [self._names[k] for k in self._cut_keys(i, part)],
                         list(self._names.values()))

    def export_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, path: Path) -> LayerExport:
        """Export layer ``i`` alone to ``path``, called as the model calls it for ``inputs`` with ``hidden_in``
        as its hidden state; its outputs are the layer's checkpoints (in hook order). Nothing is run: the caller
        feeds :attr:`LayerExport.feeds` to its own session (the drill-down adds every intermediate value as an
        output). An ONNX-file model's layer is cut out of the file."""
        if self._file_model:
            from ._onnx_file import file_layer_export

            return file_layer_export(self, self._prepared(), i, hidden_in, inputs, path, LayerExport)
        import torch
        import torch.onnx  # before the output is captured (see _export)

        from ._graph_capture import replay_arguments
        from ._layer_replay import LayerReplay, flatten

        model = self._prepared()
        hidden = torch.as_tensor(hidden_in).detach().to("cpu", torch.float32)
        layer_name, layer, args, kwargs = replay_arguments(self.net, model, i, inputs, hidden, self._sink, "cpu", self.name)
        leaves, spec = flatten((args, kwargs))
        hidden_index = next(n for n, t in enumerate(leaves) if t is hidden)
        leaves = [t.clone() for t in leaves]  # normal tensors: the eager run made inference-mode ones
        keys = self._wrapper.keys_within(layer_name)
        replay = LayerReplay(layer, self._sink, spec).eval()
        try:
            with torch.no_grad(), captured_output(path.with_name(EXPORT_LOG), f"export of {path.name}"):
                torch.onnx.export(replay, tuple(leaves), str(path), dynamo=True, opset_version=self.opset,
                                  input_names=[f"in_{n}" for n in range(len(leaves))],
                                  output_names=[str(k).replace(":", "_") for k in keys], verbose=False)
        except Exception as exc:
            raise BackendInitializationError(f"torch.onnx export of layer {i} failed: {exc}", backend=self.name,
                                             hint=f"the exporter's output is in {path.with_name(EXPORT_LOG)}") from exc
        finally:
            self._sink.clear()
        return LayerExport(path=path, layer_name=layer_name, keys=keys, hidden_input=f"in_{hidden_index}",
                           feeds={f"in_{n}": t.numpy() for n, t in enumerate(leaves)})

    def _run_exported_layer(self, i: int, hidden_in: np.ndarray, inputs: ModelInputs) -> Capture:
        """Layer ``i`` exported alone (once per input shape) and replayed on ``hidden_in``."""
        import torch

        from ._graph_capture import replay_arguments
        from ._layer_replay import flatten

        hidden = torch.tensor(hidden_in)
        model = self._prepared()
        _, _, args, kwargs = replay_arguments(self.net, model, i, inputs, hidden, self._sink, "cpu", self.name)
        leaves, _ = flatten((args, kwargs))
        key = (i, tuple((tuple(t.shape), t.dtype) for t in leaves))
        meta: JsonObject = {"variant": f"layer {i}", "replay": "export", "built_in_this_call": key not in self._layer_sessions}
        if key not in self._layer_sessions:
            shape = "x".join(str(d) for d in hidden.shape)
            path = self.onnx_path.with_name(self.onnx_path.name.replace("-checkpoints.onnx", f"-layer{i}-{shape}.onnx"))
            start = time.perf_counter()
            export = self.export_layer(i, hidden, inputs, path)
            meta["build_s"] = time.perf_counter() - start
            self._layer_sessions[key] = (self._session(path), path, export.keys)
        session, path, keys = self._layer_sessions[key]
        wanted = [k for k in keys if k in (CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i))]
        names = {inp.name for inp in session.get_inputs()}  # the exporter drops inputs the graph does not use
        feeds = {f"in_{n}": t.numpy() for n, t in enumerate(leaves) if f"in_{n}" in names}
        start = time.perf_counter()
        arrays_out = session.run([str(k).replace(":", "_") for k in wanted], feeds)
        return Capture(tensors=dict(zip(wanted, arrays_out, strict=True)), backend=self.name, dtype=self.dtype,
                       elapsed_s=time.perf_counter() - start, meta={**meta, "onnx_path": str(path)})


def _float32(hidden: HiddenState) -> np.ndarray:
    """A hidden state (a torch tensor on any device or a NumPy array) as a float32 NumPy array."""
    if isinstance(hidden, np.ndarray):
        return hidden.astype(np.float32, copy=False)
    return hidden.detach().to("cpu", sys.modules["torch"].float32).numpy()
