"""The ``Backend`` protocol every backend implements, and a small base class with the shared checks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from ..capture.keys import Capture, CheckpointKey, CheckpointSelection
from ..config import FLOAT_DTYPES
from ..errors import BackendInitializationError, ConfigurationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from ..suggest import did_you_mean

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..jsonio import JsonObject

__all__ = ["Backend", "LayerReplayBackend", "BlockReplayBackend", "BaseBackend", "Taps", "attention_block_or_mlp_checked", "FLOAT_DTYPES", "BLOCKS",
           "cpu_name", "no_reference_from_math", "HiddenState", "Tensor", "EmulatedPrecision"]

#: A value a backend produces or is handed: a torch tensor or a NumPy array.
Tensor: TypeAlias = "torch.Tensor | np.ndarray"
#: A hidden state handed to a layer or block replay: the reference's recorded tensor (torch) or array (NumPy).
HiddenState: TypeAlias = "torch.Tensor | np.ndarray"

#: A checkpoint request: ``None`` (all), a selection, or an iterable of keys / ``"post_mlp:2"`` strings.
Taps = CheckpointSelection | Iterable[Any] | None


@runtime_checkable
class Backend(Protocol):
    """One way of running a model.

    A backend owns its runtime and produces outputs; it knows nothing of sessions, storage or
    judgement. ``run_layer`` is optional (isolation / replay of a single layer).
    """

    name: str

    def availability(self) -> tuple[bool, str]:
        """``(True, "")`` when the backend can run here, else ``(False, why not)``."""
        ...

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        """Build the runtime for ``model``; raise ``BackendInitializationError`` (DF002) if it cannot."""
        ...

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        """Run the forward pass and return the requested checkpoints."""
        ...


@runtime_checkable
class LayerReplayBackend(Backend, Protocol):
    """A backend that can also replay one layer (what isolation needs)."""

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Run layer ``i`` alone on ``hidden_in``; the capture holds its ``post_attention:i`` (where
        the backend can see it) and ``post_mlp:i``."""
        ...


@runtime_checkable
class BlockReplayBackend(Backend, Protocol):
    """A backend that can also run one block of a layer alone on that block's own input (what
    judging each block on the reference's input needs)."""

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Run block ``block`` of layer ``i`` alone: ``"mlp"`` on the post-attention state
        ``hidden_in`` (the capture holds ``post_mlp:i``); ``"attention"`` on the layer's input
        (the capture holds ``post_attention:i``)."""
        ...


#: The blocks of a layer, in order, and the checkpoint each one ends at.
BLOCKS: dict[str, str] = {"attention": "post_attention", "mlp": "post_mlp"}


def attention_block_of_layer(backend: LayerReplayBackend, i: int, hidden_in: HiddenState, inputs: ModelInputs,
                             block: str) -> Capture | None:
    """``run_block`` for a backend whose attention block is its layer replay's first half: for
    ``"attention"``, :meth:`run_layer` keeping only ``post_attention:i``; None for ``"mlp"`` (the
    backend's own business); ConfigurationError (DF005) for another block name."""
    if block == "mlp":
        return None
    if block != "attention":
        raise ConfigurationError(f"unknown block {block!r}", hint=f"use one of {', '.join(BLOCKS)}")
    cap = backend.run_layer(i, hidden_in, inputs)
    key = CheckpointKey("post_attention", i)
    return Capture(tensors={key: cap.tensors[key]} if key in cap.tensors else {}, backend=cap.backend,
                   dtype=cap.dtype, elapsed_s=cap.elapsed_s, meta=cap.meta)


def attention_block_or_mlp_checked(backend: BaseBackend, i: int, hidden_in: HiddenState, inputs: ModelInputs,
                                   block: str) -> Capture | None:
    """The start of ``run_block`` for an engine that replays a layer's MLP block by a program of its
    own (an export, a compile): :func:`attention_block_of_layer`'s capture for ``"attention"``; for
    ``"mlp"``, None once that replay can run: the backend prepared, layer ``i`` one of the model's
    and its ``can_run_block()`` true (BackendInitializationError, DF002, naming why not)."""
    from ._graph_feeds import check_layer_index

    attention = attention_block_of_layer(backend, i, hidden_in, inputs, block)  # type: ignore[arg-type]
    if attention is not None:
        return attention
    check_layer_index(backend._prepared(), i, backend.name)
    ok, why = backend.can_run_block()  # type: ignore[attr-defined]  # every engine calling this has one
    if not ok:
        raise BackendInitializationError(f"cannot run the MLP block alone: {why}", backend=backend.name)
    return None


class EmulatedPrecision(Protocol):
    """A precision an engine computes at beyond a float dtype (llama.cpp's quantized weights and
    activations, its KV cache type; a module's torchao-quantized weights), and a trusted
    implementation reproducing it. An engine declares it by a method ``emulated_precision(model)``,
    read through :func:`~.capabilities.emulated_precision`."""

    #: what ``consistent_with`` calls it (``"q8_0"``)
    name: str
    #: the float dtype the emulation computes in
    dtype: str

    def describe(self) -> str: ...

    def trusted_backend(self) -> Backend: ...


def no_reference_from_math(model: LoadedModel) -> None:
    """DF004 for a model no reference written from the math implements (a generic-tier model):
    it names why and the reference that judges it instead (``float64_eager``)."""
    if model.architecture != "generic":
        return
    from ..errors import ModelLoadingError

    why = getattr(model.config, "why_generic", "") or "no reference written from the math"
    raise ModelLoadingError(
        f"no reference written from the math for model_type {model.config.model_type!r} ({why})",
        hint="use --reference-backend float64_eager (the model's own eager code in float64; 'auto', the "
             "default, picks it), or compare two backends directly (--reference-backend pytorch)",
        file=str(model.path))


def installed_version(package: str) -> str | None:
    """A package's version without importing it where it is not imported yet (an ONNX file's run
    never imports torch or onnxscript for it); None where it is not installed."""
    import sys

    module = sys.modules.get(package)
    if module is not None and hasattr(module, "__version__"):
        return module.__version__
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, ``platform`` elsewhere)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class BaseBackend:
    """Shared plumbing: availability check, dtype validation, the prepared-model guard."""

    name: str = "backend"
    supported_dtypes: tuple[str, ...] = FLOAT_DTYPES
    default_dtype: str = "float32"
    #: False for a backend that builds the model from its weights and config (an ONNX file has neither)
    runs_onnx_files: bool = True
    #: True (declared by the class itself, see :func:`.capabilities.reads_loaded_weights`) for a backend that never
    #: writes the weights it is given: it reads the loaded model's own, shared with the other readers
    reads_weights_only: bool = False

    def __init__(self) -> None:
        self.model: LoadedModel | None = None
        self.dtype: str = self.default_dtype
        self.device: str = "cpu"

    def availability(self) -> tuple[bool, str]:
        return True, ""

    def version_info(self) -> JsonObject:
        """What this backend runs on, for the session record: ``backend``, ``runtime`` and its
        version, ``device`` and ``device_name``; subclasses add their own (JSON-ready values)."""
        import platform

        return {
            "backend": self.name,
            "dtype": self.dtype,
            "device": self.device,
            "python": platform.python_version(),
            "platform": platform.platform(),
        }

    def _check_prepare(self, model: LoadedModel, dtype: str | None, device: str) -> str:
        ok, reason = self.availability()
        if not ok:
            raise BackendInitializationError(f"backend {self.name!r} is not available: {reason}", backend=self.name)
        if getattr(model, "format", None) == "onnx" and not self.runs_onnx_files:
            raise BackendInitializationError(f"backend {self.name!r} builds the model from weights and cannot run "
                                             f"an ONNX file", backend=self.name,
                                             hint="use an engine that runs ONNX files as the alternative (or none: the default one "
                                                  "is picked for an ONNX file)")
        dtype = str(dtype or self.default_dtype).removeprefix("torch.")
        if dtype not in self.supported_dtypes:
            raise BackendInitializationError(
                f"dtype {dtype!r} is not supported" + did_you_mean(dtype, self.supported_dtypes),
                hint=f"use one of {', '.join(self.supported_dtypes)}",
                backend=self.name,
            )
        self.model, self.dtype, self.device = model, dtype, device
        return dtype

    def _prepared(self) -> LoadedModel:
        if self.model is None:
            raise BackendInitializationError("run() called before prepare()", hint="call backend.prepare(model) first", backend=self.name)
        return self.model

    def _check_inputs(self, inputs: ModelInputs) -> None:
        """Ids must lie in the vocabulary and the length within the position table (DF005)."""
        config = self._prepared().config
        ids = inputs.input_ids
        if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
            raise ConfigurationError(
                f"token ids must lie in [0, {config.vocab_size}), got [{ids.min()}, {ids.max()}]", backend=self.name
            )
        if ids.shape[1] > config.max_position_embeddings:
            raise ConfigurationError(
                f"{ids.shape[1]} tokens exceed max_position_embeddings={config.max_position_embeddings}",
                backend=self.name,
            )
        pos = inputs.position_ids()
        if pos is not None and pos.size and int(pos.max()) >= config.max_position_embeddings:
            raise ConfigurationError(
                f"positions up to {int(pos.max())} exceed max_position_embeddings={config.max_position_embeddings}",
                backend=self.name, hint="lower position_offset",
            )

    def _keys(self, taps: Taps) -> list[CheckpointKey]:
        return CheckpointSelection.coerce(taps, self._prepared().num_layers)
