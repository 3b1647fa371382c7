"""``torch_reference``: the models of ``debug_framework.architectures`` (the NumPy reference's own
step functions) run through torch's kernels in any torch dtype: float64, float32, float16, bfloat16.

It is the validation engine's *trusted implementation at the alternative's precision*: the
calibration stage runs it at the alternative's dtype to measure how far a correct implementation at
that precision lands from the reference, and judges the alternative by that noise
(docs/validation.md, "Calibrated tolerances"). It shares no code with the Hugging Face model the
``pytorch``, ``inductor`` and ONNX-graph backends run, nor with any other engine's kernels. Every step runs
in the compute dtype (no float32 upcast of norms or softmax), so its noise is that of a plain
implementation at that precision: an upper estimate for implementations that upcast.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING

import numpy as np

from ..architectures.decoder import count_windows_in
from ..architectures.xp import torch_namespace
from ..capture.keys import Capture, CheckpointKey
from ..capture.spill import checkpoint_dict
from ..comparison import float64_array
from ..errors import BackendInitializationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from .base import BaseBackend, HiddenState, Taps, cpu_name, installed_version, no_reference_from_math
from .decode import (DecodePass, DecodeRun, reference_can_decode, reference_decode, reference_decode_layer,
                     reference_iter_decode)

if TYPE_CHECKING:  # torch is imported where the models run over it: an ONNX file's graph runs without it
    import torch

    from ..architectures import BertReference, LlamaReference
    from ..jsonio import JsonObject

__all__ = ["TorchReferenceBackend"]


class TorchReferenceBackend(BaseBackend):
    """The reference models over ``torch`` on the CPU, in the dtype asked for."""

    name = "torch_reference"
    supported_dtypes = ("float64", "float32", "float16", "bfloat16")
    default_dtype = "float32"
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
        self.net: LlamaReference | BertReference | None = None

    def version_info(self) -> JsonObject:
        return {**super().version_info(), "runtime": "torch", "torch": installed_version("torch"), "device_name": cpu_name(),
                "window_counts": self.window_counts}

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        dtype = self._check_prepare(model, dtype, "cpu")
        self._graph = None
        if getattr(model, "format", None) == "onnx":  # the file's own graph (backends/_onnx_file.py)
            from ._onnx_file import Float64GraphRunner

            if dtype not in ("float64", "float32", "float16", "bfloat16"):
                raise BackendInitializationError(f"an ONNX file's graph is not run at {dtype}", backend=self.name,
                                                 hint="set calibrate to false")
            self.net, self._graph = None, Float64GraphRunner(model, dtype, self.name)
            return
        from ..architectures import build_reference

        no_reference_from_math(model)
        self.net = build_reference(model.config, model.weights, dtype, torch_namespace())
        count_windows_in(self.net, self.window_counts)

    def count_windows_in(self, counts: str) -> None:
        """Count the model's sliding windows in ``counts`` (``"columns"`` or ``"tokens"``) from now on
        (``backends.capabilities.count_windows_as``: as the session's alternative does)."""
        count_windows_in(self.net, counts)
        self.window_counts = counts

    def release_replays(self) -> None:
        """An ONNX-file model: its layer cuts' sessions dropped (:meth:`Float64GraphRunner.release_replays`)."""
        if getattr(self, "_graph", None) is not None:
            self._graph.release_replays()

    def can_run_layer(self) -> tuple[bool, str]:
        """An ONNX-file model's layers replay as cuts of its graph, where its boundaries are found."""
        if getattr(self, "_graph", None) is not None:
            return self._graph.can_replay("layer")
        return True, ""

    def can_run_block(self) -> tuple[bool, str]:
        """An ONNX-file model's MLP blocks replay as cuts of its graph, where their boundaries are found."""
        if getattr(self, "_graph", None) is not None:
            return self._graph.can_replay("mlp")
        return True, ""

    def _ids(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        import torch

        self.net.positions = inputs.position_ids()  # every call reads its inputs' positions
        tt = None if inputs.token_type_ids is None else torch.from_numpy(np.asarray(inputs.token_type_ids, np.int64))
        return (torch.from_numpy(np.asarray(inputs.input_ids, np.int64)),
                torch.from_numpy(np.asarray(inputs.attention_mask, np.int64)), tt)

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        keys = self._keys(taps)
        self._check_inputs(inputs)
        if getattr(self, "_graph", None) is not None:
            return self._graph.run(inputs, keys, capture_layer_inputs)
        import torch

        ids, mask, tt = self._ids(inputs)
        layer_inputs: MutableMapping[int, torch.Tensor] | None = checkpoint_dict() if capture_layer_inputs else None
        start = time.perf_counter()
        with torch.no_grad():
            out = self.net.forward(ids, mask, {tuple(k) for k in keys}, layer_inputs, tt)
        return Capture(tensors={k: out[tuple(k)] for k in keys}, backend=self.name, dtype=self.dtype,
                       elapsed_s=time.perf_counter() - start, layer_inputs=layer_inputs or {})

    def can_decode(self) -> tuple[bool, str]:
        """A decoder decodes through its own KV cache; an encoder or an ONNX file's graph does not."""
        return reference_can_decode(self.net if getattr(self, "_graph", None) is None else None)

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None) -> DecodeRun:
        """The prefill, then ``steps`` tokens decoded through the model's KV cache (kept in the
        compute dtype; ``backends.decode.reference_decode``), teacher-forced with ``tokens``."""
        import torch

        keys = self._keys(taps)
        self._check_inputs(inputs)
        net = self.net if getattr(self, "_graph", None) is None else None
        return reference_decode(self.name, self.dtype, net, lambda x: torch.from_numpy(np.asarray(x, np.int64)),
                                inputs, steps, keys, tokens, torch.no_grad)

    def iter_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None,
                    prefill_taps: Taps = None) -> Iterator[DecodePass]:
        """:meth:`run_decode` pass by pass (``backends.decode.reference_iter_decode``), the prefill
        capturing ``prefill_taps`` (default ``taps``)."""
        import torch

        keys = self._keys(taps)
        self._check_inputs(inputs)
        net = self.net if getattr(self, "_graph", None) is None else None
        return reference_iter_decode(self.name, self.dtype, net, lambda x: torch.from_numpy(np.asarray(x, np.int64)),
                                     inputs, steps, keys, tokens, torch.no_grad,
                                     None if prefill_taps is None else self._keys(prefill_taps))

    def run_decode_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, step: int, tokens: np.ndarray) -> Capture:
        """Layer ``i`` alone at decode ``step`` on ``hidden_in`` ``[B, 1, D]`` (rounded once), over the
        cache the prefill and the earlier steps (``tokens``) wrote: its post_attention and post_mlp."""
        import torch

        self._prepared()
        h = torch_namespace().from_host(float64_array(hidden_in), self.net.dtype)
        return reference_decode_layer(self.name, self.dtype, self.net,
                                      lambda x: torch.from_numpy(np.asarray(x, np.int64)), inputs, step, tokens, i, h,
                                      torch.no_grad)

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Layer ``i`` alone on ``hidden_in`` ``[B, T, D]`` (rounded once to the compute dtype)."""
        self._prepared()
        if getattr(self, "_graph", None) is not None:
            return self._graph.replay(i, "layer", hidden_in, inputs)
        import torch

        h = torch_namespace().from_host(float64_array(hidden_in), self.net.dtype)
        _, mask, _ = self._ids(inputs)
        start = time.perf_counter()
        with torch.no_grad():
            a, out = self.net.layer(i, h, mask)
        return Capture(tensors={CheckpointKey("post_attention", i): a, CheckpointKey("post_mlp", i): out},
                       backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start)

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` (``"attention"`` or ``"mlp"``) of layer ``i`` alone on its input (rounded once)."""
        self._prepared()
        if getattr(self, "_graph", None) is not None:
            return self._graph.block(i, block, hidden_in, inputs)
        import torch

        h = torch_namespace().from_host(float64_array(hidden_in), self.net.dtype)
        _, mask, _ = self._ids(inputs)
        start = time.perf_counter()
        with torch.no_grad():
            key, out = self.net.block(i, block, h, mask)
        return Capture(tensors={CheckpointKey(*key): out}, backend=self.name, dtype=self.dtype,
                       elapsed_s=time.perf_counter() - start)
