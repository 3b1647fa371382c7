"""User backends: plug your own implementation (kernels, engine) in and validate it.

* :func:`user_backend` wraps any Python object that returns checkpoint tensors.
* :func:`module_backend` wraps an ``nn.Module`` builder; checkpoints come from forward hooks on
  the Hugging Face module names, or on the modules of an explicit map.

Both return a *factory*: pass it to :func:`register_backend` or call it to get a backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..capture.keys import Capture, CheckpointKey
from ..errors import BackendInitializationError, BackendRuntimeError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from .base import FLOAT_DTYPES, BaseBackend, HiddenState, Taps, Tensor
from .decode import DecodePass, DecodeRun, iter_runner_decode, runner_decode

if TYPE_CHECKING:  # torch is imported when a module backend is built, never for a callable one
    import numpy as np

    from ..jsonio import JsonObject
    from .torch_module import ModuleBuilder, TorchModuleBackend

__all__ = ["user_backend", "module_backend", "CallableBackend"]

#: ``builder(model, dtype, device) -> runner``; ``runner(inputs, keys) -> {checkpoint: tensor}``.
RunnerBuilder = Callable[[LoadedModel, str, str], Any]


class CallableBackend(BaseBackend):
    """A backend around a user object: ``runner(inputs, keys)`` (or ``runner.run(inputs, keys)``)
    returns a mapping whose keys are ``CheckpointKey``, ``(name, layer)`` or ``"post_mlp:2"``.
    If the runner has ``run_layer(i, hidden_in, inputs) -> (post_attention, post_mlp)``, isolation works too;
    with ``run_block(i, block, hidden_in, inputs) -> tensor`` each block is judged on the reference's input;
    with ``prefill`` and ``decode_step`` (and optionally ``kv_cache``) it decodes
    (:func:`~debug_framework.backends.decode.runner_decode`)."""

    def __init__(self, name: str, builder: RunnerBuilder, dtypes: tuple[str, ...] = FLOAT_DTYPES,
                 availability: Callable[[], tuple[bool, str]] | None = None) -> None:
        super().__init__()
        self.name = name
        self.builder = builder
        self.supported_dtypes = dtypes
        self._availability = availability
        self.runner: Any = None

    def availability(self) -> tuple[bool, str]:
        return self._availability() if self._availability else (True, "")

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        dtype = self._check_prepare(model, dtype, device)
        try:
            self.runner = self.builder(model, dtype, device)
        except BackendInitializationError:
            raise
        except Exception as exc:
            raise BackendInitializationError(f"the user builder failed: {exc}", backend=self.name) from exc

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        keys = self._keys(taps)
        self._check_inputs(inputs)
        fn = getattr(self.runner, "run", self.runner)
        start = time.perf_counter()
        produced = fn(inputs, keys)
        elapsed = time.perf_counter() - start
        if not isinstance(produced, Mapping):
            raise BackendRuntimeError(
                f"user backend {self.name!r} returned {type(produced).__name__}, not a mapping of checkpoints",
                backend=self.name, call="run", hint="return {CheckpointKey(...) or 'post_mlp:2': tensor}",
            )
        got = {CheckpointKey.parse(k): v for k, v in produced.items()}
        return Capture(tensors={k: got[k] for k in keys if k in got}, backend=self.name, dtype=self.dtype, elapsed_s=elapsed)

    def can_run_layer(self) -> tuple[bool, str]:
        """Isolation works when the (prepared) runner has ``run_layer``."""
        if callable(getattr(self.runner, "run_layer", None)):
            return True, ""
        return False, "has no run_layer(i, hidden_in, inputs) on its runner"

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        if not hasattr(self.runner, "run_layer"):
            raise BackendInitializationError("this user backend has no run_layer", backend=self.name)
        start = time.perf_counter()
        a, out = self.runner.run_layer(i, hidden_in, inputs)
        return Capture(
            tensors={CheckpointKey("post_attention", i): a, CheckpointKey("post_mlp", i): out},
            backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start,
        )

    def can_decode(self) -> tuple[bool, str]:
        """Decode steps run when the (prepared) runner has ``prefill`` and ``decode_step``."""
        if callable(getattr(self.runner, "prefill", None)) and callable(getattr(self.runner, "decode_step", None)):
            return True, ""
        return False, "has no prefill(inputs, keys) and decode_step(tokens, positions, keys) on its runner"

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None) -> DecodeRun:
        """The runner's prefill, then ``steps`` of its ``decode_step`` (teacher-forced with ``tokens``)."""
        ok, why = self.can_decode()
        if not ok:
            raise BackendInitializationError(f"this user backend {why}", backend=self.name)
        keys = self._keys(taps)
        self._check_inputs(inputs)

        def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
            return Capture(tensors={k: tensors[k] for k in keys if k in tensors}, backend=self.name, dtype=self.dtype,
                           elapsed_s=seconds)

        return runner_decode(self.name, self.runner, inputs, steps, keys, tokens, wrap)

    def iter_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None,
                    prefill_taps: Taps = None) -> Iterator[DecodePass]:
        """:meth:`run_decode` pass by pass (``backends.decode.iter_runner_decode``), the runner's
        prefill asked for ``prefill_taps`` (default ``taps``)."""
        ok, why = self.can_decode()
        if not ok:
            raise BackendInitializationError(f"this user backend {why}", backend=self.name)
        keys = self._keys(taps)
        first = keys if prefill_taps is None else self._keys(prefill_taps)
        self._check_inputs(inputs)
        wanted = set(keys) | set(first)

        def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
            return Capture(tensors={k: v for k, v in tensors.items() if k in wanted}, backend=self.name,
                           dtype=self.dtype, elapsed_s=seconds)

        return iter_runner_decode(self.name, self.runner, inputs, steps, keys, tokens, wrap, first)

    def can_run_block(self) -> tuple[bool, str]:
        """Blocks run alone when the (prepared) runner has ``run_block``."""
        if callable(getattr(self.runner, "run_block", None)):
            return True, ""
        return False, "has no run_block(i, block, hidden_in, inputs) on its runner"

    def can_run_layer_traced(self) -> tuple[bool, str]:
        """Named intermediate values of a layer when the (prepared) runner has ``run_layer_traced``."""
        if callable(getattr(self.runner, "run_layer_traced", None)):
            return True, ""
        return False, "has no run_layer_traced(i, hidden_in, inputs) on its runner"

    def run_layer_traced(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> list[tuple[str, Any]]:
        """The runner's ``run_layer_traced(i, hidden_in, inputs)``: layer ``i`` on ``hidden_in`` with
        its named intermediate values, in the order computed (a mapping or ``(name, value)`` pairs)."""
        if not callable(getattr(self.runner, "run_layer_traced", None)):
            raise BackendInitializationError("this user backend has no run_layer_traced", backend=self.name)
        out = self.runner.run_layer_traced(i, hidden_in, inputs)
        return list(out.items()) if isinstance(out, Mapping) else [(str(n), v) for n, v in out]

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """The runner's ``run_block(i, block, hidden_in, inputs) -> tensor``: ``"mlp"`` on the
        post-attention state gives ``post_mlp:i``, ``"attention"`` on the layer input ``post_attention:i``."""
        if not callable(getattr(self.runner, "run_block", None)):
            raise BackendInitializationError("this user backend has no run_block", backend=self.name)
        key = CheckpointKey("post_mlp" if block == "mlp" else "post_attention", i)
        start = time.perf_counter()
        out = self.runner.run_block(i, block, hidden_in, inputs)
        return Capture(tensors={key: out}, backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start)


def user_backend(
    name: str,
    builder: RunnerBuilder,
    *,
    dtypes: tuple[str, ...] = FLOAT_DTYPES,
    availability: Callable[[], tuple[bool, str]] | None = None,
) -> Callable[[], CallableBackend]:
    """A factory for a backend around any Python object that returns checkpoint tensors.

    Args:
        name: the backend's name.
        builder: ``builder(model, dtype, device)`` returns the runner (called at ``prepare``).
        dtypes: the dtypes the runner supports.
        availability: ``() -> (ok, reason)``; default always available.
    """
    return lambda: CallableBackend(name, builder, dtypes, availability)


def module_backend(
    name: str,
    builder: ModuleBuilder,
    *,
    checkpoint_map: Mapping[str, Any] | None = None,
    layer_modules: Mapping[int, str] | None = None,
) -> Callable[..., TorchModuleBackend]:
    """A factory for a backend around an ``nn.Module`` builder.

    Args:
        name: the backend's name.
        builder: ``builder(model, torch_dtype, device) -> nn.Module``, called with ``**inputs.torch()``.
        checkpoint_map: module name -> checkpoint; ``None`` finds checkpoints from the Hugging Face
            module names (``encoder.layer.3``, ``model.layers.3.post_attention_layernorm`` ...).
        layer_modules: layer index -> module name (layer inputs and ``run_layer``).
    """
    from .torch_module import TorchModuleBackend
    from .torchao.reference import torchao_precision

    # a module holding torchao-quantized weights declares that precision (judged at it by --dtype auto)
    return lambda device="cpu": TorchModuleBackend(name, builder, checkpoint_map, layer_modules, device,
                                                   precision=torchao_precision)
