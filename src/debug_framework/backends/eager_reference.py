"""``float64_eager``: the generic tier's reference, the model's own eager ``transformers`` code run
in float64 on the CPU (as PyTorch's ``torch._dynamo.utils.same`` judges a model against a float64
run of itself).

It is the default reference of every model without a reference written from the math
(``modelio.generic``); at the alternative's precision the same backend is the calibration run
(docs/validation.md, "Calibrated tolerances"), so a correct implementation's rounding at that
precision is each checkpoint's noise. Checkpoints are found from the module structure
(:mod:`debug_framework.capture.structure`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ContextManager

from ..errors import BackendInitializationError, ModelLoadingError
from ..modelio.loader import LoadedModel
from ._attention_rows import QUERY_ROWS, attention_in_row_blocks
from ._streamed_layers import NoNarrowing
from .decode import DECODE_HOLD_BYTES
from .pytorch import PyTorchBackend, build_hf_model
from .reference_choice import FLOAT64_EAGER, FROM_MATH, oracle_for, reference_for
from .torch_module import TORCH_DTYPES

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..capture.keys import Capture
    from ..jsonio import JsonObject
    from ..modelio.inputs import ModelInputs
    from .base import Taps
    from .decode import DecodePass, DecodeRun


#: the largest float32 copy of a model the float64 reference's greedy decode builds as its draft
#: (:meth:`EagerReferenceBackend._decode_draft`); a larger model decodes a step a pass
DRAFT_BYTES = 512 * 2**20

__all__ = ["EagerReferenceBackend", "DECODE_HOLD_BYTES", "DRAFT_BYTES", "NoNarrowing", "FLOAT64_EAGER", "FROM_MATH", "reference_for", "oracle_for"]


def _draft_bytes(model: LoadedModel) -> int:
    """The new memory a float32 copy of ``model`` takes: 4 bytes an element of every tensor the
    weights do not store in float32 (those are the shared mapping's, not copied); every tensor
    counted where the weights do not say their dtypes or load through ``transformers``' own loader."""
    import math

    weights = model.weights
    shape = getattr(weights, "shape", None)  # from the files' headers, nothing read
    dtype = getattr(weights, "dtype_name", None)
    # loaded through transformers' own loader, or dtypes unsaid: a copy of every tensor
    every = getattr(model.config, "weights_renamed", False) or dtype is None
    return sum(4 * math.prod(shape(n) if shape is not None else getattr(weights[n], "shape", ()))
               for n in weights if every or str(dtype(n)).upper() != "F32")


def _rope_follows_length(module: object) -> bool:
    """Whether a rotary embedding module changes its frequencies with the longest position of a
    pass (``transformers``' dynamic NTK and LongRoPE): a pass over several steps would then use
    another frequency than a step alone near the switch, so such a model decodes a step a pass."""
    kind = getattr(module, "rope_type", None)
    kinds = list(kind.values()) if isinstance(kind, dict) else [kind]
    return any(isinstance(k, str) and ("dynamic" in k or k == "longrope") for k in kinds)


class EagerReferenceBackend(PyTorchBackend):
    """The model's own eager code on the CPU: float64 by default (the reference); float32, float16
    or bfloat16 as the calibration run at the alternative's precision. In float64 the whole
    computation is float64: the model's own casts to float32 (its norms', its softmax's) keep
    float64 (:class:`NoNarrowing`).

    Where the weights store another dtype, the model's repeated layers are converted one at a time
    as they are called, and its token embeddings and LM head as they are used
    (:mod:`._streamed_layers`): the backend holds the other tensors and one layer at its dtype,
    never a whole-model float64 copy. A model whose forward fails that way (a layer's parameter
    used outside its layer) is loaded whole instead, and :attr:`stream_note` says so."""

    default_dtype = "float64"
    #: only reads its weights: given the loaded model itself (backends.capabilities.reads_loaded_weights)
    reads_weights_only = True
    #: its decode may run ahead in a forked child process (capabilities.Capabilities.decode_ahead)
    decode_ahead = True
    #: holds the tensors outside the repeated layers and one layer (the memory estimate's rule)
    streams_layers = True

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.name = FLOAT64_EAGER
        #: why the last preparation loaded the model whole ("" where it streamed or needed not)
        self.stream_note = ""
        #: every stored parameter converted in place for a decode (:meth:`_convert_whole`)
        self._whole = False
        #: its attention runs a block of query rows at a time (:mod:`._attention_rows`)
        self.row_blocks = False
        self._loaded: LoadedModel | None = None

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        self.builder = functools.partial(build_hf_model, stream=True)
        self.stream_note = ""
        self._loaded = model
        try:
            super().prepare(model, dtype, device)
        except BackendInitializationError as exc:
            if getattr(self.module, "streamer", None) is None:
                raise
            self.stream_note = f"its layers converted one at a time fail ({exc.message}); loaded whole"
            self.module = None
            self.builder = build_hf_model
            super().prepare(model, dtype, device)
        # a long prefill's attention scores a block of query rows at a time: the same arithmetic
        self.row_blocks = self.module is not None and attention_in_row_blocks(self.module)

    @property
    def streaming(self) -> bool:
        """Whether the prepared model converts its layers one at a time."""
        return getattr(self.module, "streamer", None) is not None

    @contextlib.contextmanager
    def _exact(self) -> Iterator[None]:
        dtype = TORCH_DTYPES[self.dtype]
        keep = self.dtype == "float64" or self.streaming  # stored tables' dtypes must not narrow the run
        # converted whole for a decode (:meth:`_convert_whole`): no stored table left to convert
        tables = None if self._whole else getattr(self.module, "stored_tables", None)
        with NoNarrowing(dtype) if keep else contextlib.nullcontext(), \
                tables if tables else contextlib.nullcontext():
            yield

    def _discover(self, model: LoadedModel) -> None:
        with self._exact():  # the forward that finds the checkpoints runs as every run does
            super()._discover(model)

    def _release(self) -> None:
        """Drop the last layer's converted copy after a whole-model run (the next call needs
        another layer first); a layer's replay keeps it for its block's replay."""
        streamer = getattr(self.module, "streamer", None)
        if streamer is not None:
            streamer.release()

    def run(self, *args: Any, **kwargs: Any) -> Capture:
        try:
            with self._exact():
                return super().run(*args, **kwargs)
        finally:
            self._release()

    def run_layer(self, *args: Any, **kwargs: Any) -> Capture:
        with self._exact():
            return super().run_layer(*args, **kwargs)

    def run_block(self, *args: Any, **kwargs: Any) -> Capture:
        with self._exact():
            return super().run_block(*args, **kwargs)

    def run_decode(self, *args: Any, **kwargs: Any) -> DecodeRun:
        try:
            with self._exact():
                return super().run_decode(*args, **kwargs)
        finally:
            self._release()

    def iter_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None,
                    prefill_taps: Taps = None) -> Iterator[DecodePass]:
        """The decode pass by pass, each pass exact (float64 kept where the model narrows); a
        streamed model keeps its converted layers for the whole decode (up to
        :data:`DECODE_HOLD_BYTES`), released when the decode ends or its caller stops."""
        streamer = getattr(self.module, "streamer", None)
        passes = super().iter_decode(inputs, steps, taps, tokens, prefill_taps)

        def held() -> Iterator[DecodePass]:
            undo = self._convert_whole(DECODE_HOLD_BYTES)
            if undo is None and streamer is not None:
                streamer.hold(DECODE_HOLD_BYTES)
            try:
                yield from passes
            finally:
                if undo is not None:
                    undo()
                self._release()
        return held()

    def _convert_whole(self, budget: int) -> Callable[[], None] | None:
        """Every parameter kept as stored converted to the compute dtype in place, where together
        they take at most ``budget`` bytes at it: no layer converted again at each step, no table
        converted block by block (:class:`~._streamed_layers.StoredTables` left out). Returns what
        puts the stored tensors back; None where nothing is stored otherwise or it does not fit."""
        import torch

        if self.module is None or not self.streaming:
            return None
        dtype = TORCH_DTYPES[self.dtype]
        stored = [p for p in self.module.parameters() if p.is_floating_point() and p.dtype != dtype]
        if not stored or sum(p.numel() for p in stored) * dtype.itemsize > budget:
            return None
        originals = [(p, p.data) for p in stored]
        with torch.no_grad():
            for p, data in originals:
                p.data = data.to(dtype)
        self._whole = True
        streamer = self.module.streamer  # nothing left for its hooks to convert while the decode runs
        streamer.paused = True

        def undo() -> None:
            for p, data in originals:
                p.data = data
            self._whole = False
            streamer.paused = False
        return undo

    def _decode_context(self) -> ContextManager[object]:
        return self._exact()

    def _decode_draft(self) -> torch.nn.Module | None:
        """In float64, a float32 copy of the model (its own eager code, built anew from the weights)
        where its new memory is at most :data:`DRAFT_BYTES`: its greedy tokens let the decode compute
        several steps a pass, every step's tensors still this backend's own (:mod:`._decode_draft`).
        Tensors the weights store in float32 take no new memory (the pages of the mapping the
        loaded weights' readers share, read only); the others take 4 bytes an element."""
        import torch

        if self.dtype != "float64" or self.device != "cpu" or self.module is None or self._loaded is None:
            return None
        if getattr(self._loaded, "router_layers", None):  # a router's logits, [tokens, experts], cannot be cut per
            return None                                    # step (and its stacked experts would be copies)
        if any(_rope_follows_length(m) for m in self.module.modules()):
            return None
        if _draft_bytes(self._loaded) > DRAFT_BYTES:
            return None
        try:
            draft = build_hf_model(self._loaded, torch.float32, "cpu", shared=True).eval()
        except (BackendInitializationError, ModelLoadingError, RuntimeError, ValueError):
            return None  # no draft: a step a pass, as without one
        # its attention the fastest the model has (a long decode's eager scores cost the draft most):
        # its tokens decide only how many steps a pass computes
        with contextlib.suppress(AttributeError, ImportError, KeyError, RuntimeError, ValueError):
            draft.set_attn_implementation("sdpa")
        return draft

    def run_decode_layer(self, *args: Any, **kwargs: Any) -> Capture:
        with self._exact():
            return super().run_decode_layer(*args, **kwargs)

    def version_info(self) -> JsonObject:
        weights = ("streamed: layers converted one at a time, tables as used" if self.streaming
                   else self.stream_note or "held whole at the compute dtype")
        attention = (f"eager, {QUERY_ROWS} query rows at a time" if self.row_blocks else "eager")
        return {**super().version_info(), "reference": "the model's own transformers eager code", "weights": weights,
                "attention": attention}
