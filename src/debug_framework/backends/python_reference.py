"""``python_reference``: the models of ``debug_framework.architectures`` over NumPy (float64 or
float32); always available. Other engines run the same models over their own arrays (:mod:`debug_framework.architectures.xp`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING

import numpy as np

from ..architectures import BertReference, LlamaReference, build_reference
from ..architectures.decoder import count_windows_in
from ..capture.keys import Capture, CheckpointKey
from ..capture.spill import checkpoint_dict
from ..errors import BackendInitializationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from .base import BaseBackend, HiddenState, Taps, cpu_name, no_reference_from_math
from .decode import (DecodePass, DecodeRun, reference_can_decode, reference_decode, reference_decode_layer,
                     reference_iter_decode)

if TYPE_CHECKING:
    from ..jsonio import JsonObject
    from ._onnx_file import Float64GraphRunner

__all__ = ["PythonReferenceBackend"]


def _host(x: HiddenState, dtype: np.dtype | str) -> np.ndarray:
    """A hidden state (a torch tensor or anything NumPy reads) as a NumPy array of ``dtype``."""
    return np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=dtype)


class PythonReferenceBackend(BaseBackend):
    """The reference: textbook NumPy, float64 by default (float32 also)."""

    name = "python_reference"
    supported_dtypes = ("float64", "float32")
    default_dtype = "float64"
    #: only reads its weights: given the loaded model itself (backends.capabilities.reads_loaded_weights)
    reads_weights_only = True
    #: its decode may run ahead in a forked child process (capabilities.Capabilities.decode_ahead)
    decode_ahead = True
    #: the models read their weights layer by layer (``architectures.layout``): about one layer held at a time
    streams_weights = True
    #: what the model's sliding windows count on a padded row (``backends.capabilities.WINDOW_COUNTS``):
    #: transformers' ``"columns"``, or ``"tokens"`` where the session's alternative counts them so
    window_counts = "columns"

    def __init__(self) -> None:
        super().__init__()
        self.reference: LlamaReference | BertReference | None = None
        self._graph: Float64GraphRunner | None = None  # an ONNX-file model: its own graph, evaluated in float64

    def version_info(self) -> JsonObject:
        info = super().version_info()
        try:
            import scipy

            scipy_version = scipy.__version__
        except ImportError:  # erf then falls back to math.erf
            scipy_version = None
        return {**info, "runtime": "numpy", "numpy": np.__version__, "scipy": scipy_version, "device_name": cpu_name(),
                "window_counts": self.window_counts}

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        dtype = self._check_prepare(model, dtype, device)
        if device != "cpu":
            raise BackendInitializationError(f"device {device!r} is not supported; NumPy runs on cpu", backend=self.name)
        if getattr(model, "format", None) == "onnx":  # the file's graph in float64 (backends/_onnx_file.py)
            from ._onnx_file import Float64GraphRunner

            self.reference, self._graph = None, Float64GraphRunner(model, dtype, self.name)
            return
        self._graph = None
        no_reference_from_math(model)
        self.reference = build_reference(model.config, model.weights, np.dtype(dtype))
        count_windows_in(self.reference, self.window_counts)

    def count_windows_in(self, counts: str) -> None:
        """Count the model's sliding windows in ``counts`` (``"columns"`` or ``"tokens"``) from now on
        (``backends.capabilities.count_windows_as``: as the session's alternative does)."""
        count_windows_in(self.reference, counts)
        self.window_counts = counts

    def release_replays(self) -> None:
        """An ONNX-file model: its layer cuts' sessions dropped (:meth:`Float64GraphRunner.release_replays`)."""
        if self._graph is not None:
            self._graph.release_replays()

    def can_run_layer(self) -> tuple[bool, str]:
        """An ONNX-file model's layers replay as cuts of its graph, where its boundaries are found."""
        if self._graph is not None:
            return self._graph.can_replay("layer")
        return True, ""

    def can_run_block(self) -> tuple[bool, str]:
        """An ONNX-file model's MLP blocks replay as cuts of its graph, where their boundaries are found."""
        if self._graph is not None:
            return self._graph.can_replay("mlp")
        return True, ""

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        keys = self._keys(taps)
        self._check_inputs(inputs)
        if self._graph is not None:
            return self._graph.run(inputs, keys, capture_layer_inputs)
        layer_inputs: MutableMapping[int, np.ndarray] | None = checkpoint_dict() if capture_layer_inputs else None
        start = time.perf_counter()
        self.reference.positions = inputs.position_ids()
        out = self.reference.forward(
            inputs.input_ids, inputs.attention_mask, set(keys), layer_inputs, inputs.token_type_ids
        )
        elapsed = time.perf_counter() - start
        return Capture(
            tensors={k: out[tuple(k)] for k in keys},
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=elapsed,
            layer_inputs=layer_inputs or {},
        )

    def can_decode(self) -> tuple[bool, str]:
        """A decoder decodes through its own KV cache; an encoder or an ONNX file's graph does not."""
        return reference_can_decode(self.reference if self._graph is None else None)

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None) -> DecodeRun:
        """The prefill, then ``steps`` tokens decoded through the model's KV cache
        (``backends.decode.reference_decode``), teacher-forced with ``tokens`` ``[batch, steps]``."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        return reference_decode(self.name, self.dtype, self.reference if self._graph is None else None,
                                lambda x: x, inputs, steps, keys, tokens, contextlib.nullcontext)

    def iter_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None,
                    prefill_taps: Taps = None) -> Iterator[DecodePass]:
        """:meth:`run_decode` pass by pass (``backends.decode.reference_iter_decode``), the prefill
        capturing ``prefill_taps`` (default ``taps``)."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        return reference_iter_decode(self.name, self.dtype, self.reference if self._graph is None else None,
                                     lambda x: x, inputs, steps, keys, tokens, contextlib.nullcontext,
                                     None if prefill_taps is None else self._keys(prefill_taps))

    def run_decode_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, step: int, tokens: np.ndarray) -> Capture:
        """Layer ``i`` alone at decode ``step`` on ``hidden_in`` ``[B, 1, D]``, over the cache the
        prefill and the earlier steps (``tokens``) wrote: its post_attention and post_mlp."""
        self._prepared()
        return reference_decode_layer(self.name, self.dtype, self.reference, lambda x: x, inputs, step, tokens, i,
                                      _host(hidden_in, self.dtype), contextlib.nullcontext)

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Run layer ``i`` alone on ``hidden_in`` ``[B, T, D]``; returns its post_attention and post_mlp."""
        self._prepared()
        if self._graph is not None:
            return self._graph.replay(i, "layer", hidden_in, inputs)
        h = _host(hidden_in, self.dtype)
        start = time.perf_counter()
        self.reference.positions = inputs.position_ids()
        a, out = self.reference.layer(i, h, inputs.attention_mask)
        return Capture(
            tensors={CheckpointKey("post_attention", i): a, CheckpointKey("post_mlp", i): out},
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=time.perf_counter() - start,
        )

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` (``"attention"`` or ``"mlp"``) of layer ``i`` alone on its input ``[B, T, D]``."""
        self._prepared()
        if self._graph is not None:
            return self._graph.block(i, block, hidden_in, inputs)
        h = _host(hidden_in, self.dtype)
        start = time.perf_counter()
        self.reference.positions = inputs.position_ids()
        key, out = self.reference.block(i, block, h, inputs.attention_mask)
        return Capture(tensors={CheckpointKey(*key): out}, backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start)
