"""Running any ``torch.nn.Module`` with checkpoints taken by forward hooks.

:class:`TorchModuleBackend` is the shared machinery of the ``pytorch`` backend (Hugging Face
eager models) and of user ``nn.Module`` backends (:func:`debug_framework.backends.module_backend`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ContextManager, TypeAlias

import numpy as np
import torch

from ..capture.hooks import HookCapture, ModuleTap, hf_attention_seam, hf_layer_modules, hf_module_taps
from ..capture.keys import Capture, CheckpointKey
from ..capture.structure import MAP_HINT, ModelStructure, discover
from ..errors import BackendInitializationError, ModelLoadingError
from ..measure import Timer
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from .base import BaseBackend, HiddenState, Taps, Tensor, attention_block_of_layer, cpu_name
from .decode import DecodePass, DecodeRun, iter_module_decode, module_decode

if TYPE_CHECKING:
    from ..jsonio import JsonObject
    from .base import EmulatedPrecision

__all__ = ["TorchModuleBackend", "ModuleBuilder", "PrecisionOf", "TORCH_DTYPES", "torch_device_info"]

TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

#: A generic-tier model's structure and MLP-block support, found once per model and module class in
#: a process (the reference, the alternative and the calibration share it: module paths do not
#: depend on the dtype).
_STRUCTURES: dict[tuple[str, str, str], tuple[ModelStructure, tuple[bool, str]]] = {}

#: ``builder(model, torch_dtype, device) -> nn.Module`` ready to be called with ``**inputs.torch()``.
ModuleBuilder = Callable[[LoadedModel, torch.dtype, str], torch.nn.Module]

#: How a module backend's precision is read from its module (``precision`` of
#: :class:`TorchModuleBackend`): the backend and its module -> the precision declared, or None.
PrecisionOf: TypeAlias = "Callable[[TorchModuleBackend, torch.nn.Module], EmulatedPrecision | None]"


def _cuda_reason(device: str) -> str:
    if not device.startswith("cuda"):
        return ""
    if not torch.cuda.is_available():
        return f"device {device!r} requested but CUDA is not available (torch {torch.__version__}, cuda build: {torch.version.cuda})"
    return ""


def torch_device_info(device: str) -> JsonObject:
    """torch's version and the device's name (GPU model, compute capability, CUDA version on cuda)."""
    info: JsonObject = {"runtime": "torch", "torch": torch.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        info.update(
            device_name=torch.cuda.get_device_name(index),
            compute_capability=f"{major}.{minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        info.update(device_name=cpu_name(), threads=torch.get_num_threads())
    return info


class TorchModuleBackend(BaseBackend):
    """A torch module run in eager mode; checkpoints from module outputs/inputs via hooks.

    Args:
        name: the backend's name.
        builder: builds the module for a loaded model.
        checkpoint_map: module name -> checkpoint (``CheckpointKey``, ``(name, layer)`` or
            ``"post_mlp:2"``); ``None`` means the Hugging Face module names of the architecture.
        layer_modules: layer index -> module name, for layer inputs and ``run_layer``; ``None``
            means the Hugging Face layer names.
        device: default device (``"cpu"`` or ``"cuda"``).
        precision: what the module's own precision is, given the backend and its module (None: a
            float dtype only); ``module_backend`` passes torchao's
            (:func:`~debug_framework.backends.torchao.reference.torchao_precision`).
    """

    def __init__(
        self,
        name: str,
        builder: ModuleBuilder,
        checkpoint_map: Mapping[str, Any] | None = None,
        layer_modules: Mapping[int, str] | None = None,
        device: str = "cpu",
        precision: PrecisionOf | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.builder = builder
        self.precision_of = precision
        self.checkpoint_map = checkpoint_map
        self._layer_modules = layer_modules
        self.device = device
        self.module: torch.nn.Module | None = None
        self.taps: list[ModuleTap] = []
        self.architecture: str | None = None
        #: the module structure of a generic-tier model (checkpoints found from its modules)
        self.structure: ModelStructure | None = None
        self._block_support: tuple[bool, str] = (True, "")
        #: whether a replay may skip the layers before the replayed one (None: not yet checked)
        self._skip_ok: bool | None = None
        #: the module :meth:`declared_dtype` built (its model's digest, dtype, device), kept for :meth:`prepare`
        self._declared_module: torch.nn.Module | None = None
        self._declared_for: tuple[str, str, str] | None = None

    def availability(self) -> tuple[bool, str]:
        reason = _cuda_reason(self.device)
        return (not reason, reason)

    def version_info(self) -> JsonObject:
        return {**super().version_info(), **torch_device_info(self.device)}

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        if device is not None:
            self.device = device
        dtype = self._check_prepare(model, dtype, self.device)
        module = self._declared_module if self._declared_for == (model.digest, dtype, self.device) else None
        self._declared_module = self._declared_for = None
        self.module = (module if module is not None else self._build(model, dtype)).eval()
        self.architecture = model.architecture
        self.structure = None
        self._skip_ok = None  # whether replays may skip earlier layers is a fact of this model: checked anew
        if self.checkpoint_map is None and model.architecture == "generic":
            self._discover(model)
        elif self.checkpoint_map is None:
            self.taps = hf_module_taps(model.architecture, model.num_layers, model.router_layers)
        else:
            self.taps = []
            for mod_name, key in self.checkpoint_map.items():
                parsed = CheckpointKey.parse(key)
                self.taps.append(ModuleTap(mod_name, parsed))
        if self._layer_modules is None and self.structure is not None:
            self.layer_modules = self.structure.layer_modules
        elif self._layer_modules is None:
            self.layer_modules = dict(enumerate(hf_layer_modules(model.architecture, model.num_layers)))
        else:
            self.layer_modules = dict(self._layer_modules)

    def _build(self, model: LoadedModel, dtype: str) -> torch.nn.Module:
        try:
            return self.builder(model, TORCH_DTYPES[dtype], self.device)
        except (BackendInitializationError, ModelLoadingError):  # DF002 / DF004 as they are
            raise
        except Exception as exc:  # a user's builder may raise anything; report it as DF002
            raise BackendInitializationError(f"building the module failed: {exc}", backend=self.name) from exc

    def built_module(self, model: LoadedModel, dtype: str) -> torch.nn.Module:
        """The module built for ``model`` at ``dtype`` before :meth:`prepare`, on a copy of the weights
        of its own (``LoadedModel.fork``), kept for the ``prepare`` at that dtype that follows."""
        if self._declared_module is None or self._declared_for != (model.digest, dtype, self.device):
            fork = getattr(model, "fork", None)
            self._declared_module = self._build(fork() if callable(fork) else model, dtype)
            self._declared_for = (model.digest, dtype, self.device)
        return self._declared_module

    def declared_dtype(self, model: LoadedModel) -> tuple[str, str] | None:
        """What ``--dtype auto`` judges the module at: its torchao quantization where it holds one
        (:func:`~debug_framework.backends.torchao.weights.declared_quantization` of the module built
        here, kept for :meth:`prepare`), else None (its default).
        Only a user's module (``module_backend``) is built to see: the framework's own subclasses
        (``pytorch``: the stock eager model) declare nothing."""
        if type(self) is not TorchModuleBackend:
            return None
        from .torchao.weights import declared_quantization

        return declared_quantization(self.built_module(model, "float32"))

    def emulated_precision(self, model: LoadedModel) -> EmulatedPrecision | None:
        """The precision the module computes at beyond a float dtype, with its trusted emulation
        (a user's module holding torchao weights: its scheme, the eager model quantized the same way,
        :class:`~debug_framework.backends.torchao.reference.TorchaoPrecision`), None where it declares
        none. Read of the module prepared, else of the one built for ``--dtype auto``."""
        if self.precision_of is None:
            return None
        module = self.module if self.module is not None else self.built_module(model, "float32")
        return self.precision_of(self, module)

    def _discover(self, model: LoadedModel) -> None:
        """The checkpoints of a generic-tier model from its module structure (one forward pass on a
        small example), and whether its MLP blocks can run alone (checked on the first layer of
        each stack: the replay through the seam must give the layer's own output)."""
        from ..modelio.generic import random_inputs

        assert self.module is not None
        cache_key = (model.digest, str(model.path), type(self.module).__qualname__)
        if cache_key in _STRUCTURES:  # the same model's modules, found once per process
            self.structure, self._block_support = _STRUCTURES[cache_key]
            self.taps, self.layer_modules = list(self.structure.taps), self.structure.layer_modules
            return
        example = random_inputs(model.config, 1, 8, seed=0)  # type: ignore[arg-type]
        try:
            structure = discover(self.module, model.num_layers, self._kwargs(example))
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # the model's own forward failed
            raise BackendInitializationError(
                f"the model's own {model.config.model_type} code fails on a forward pass in {self.dtype} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}), so its checkpoints "
                "cannot be found at this precision (the generic tier's reference runs it in float64); " + MAP_HINT,
                backend=self.name) from exc
        self.structure, self.taps = structure, list(structure.taps)
        self.layer_modules = structure.layer_modules
        self._verify_seams(structure, example)
        if len(_STRUCTURES) >= 16:
            _STRUCTURES.pop(next(iter(_STRUCTURES)))
        _STRUCTURES[cache_key] = (structure, self._block_support)

    def _verify_seams(self, structure: ModelStructure, example: ModelInputs) -> None:
        """Whether the MLP blocks run alone: the replay through the seam must give the layer's own
        output, checked on the first layer of each stack."""
        parallel = [i for i, layer in enumerate(structure.layers) if layer.parallel]
        if parallel:
            self._block_support = (False, f"runs attention and MLP in parallel (layer {parallel[0]}): "
                                          "the MLP is judged with the whole layer")
            return
        firsts = [i for i, layer in enumerate(structure.layers)
                  if i == 0 or layer.module.rsplit(".", 1)[0] != structure.layers[i - 1].module.rsplit(".", 1)[0]]
        self._block_support = (True, "")
        for i in firsts:
            keys = {CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)}
            # the forward stopped after layer i: a streamed model converts no later layer for it
            with torch.inference_mode(), HookCapture(self.module, [t for t in self.taps if t.key in keys],
                                                     stop_after=structure.layers[i].module) as hooks:
                hooks.run(self.module, **self._kwargs(example))
            cap = hooks.tensors
            try:
                replay = self.run_block(i, "mlp", cap[CheckpointKey("post_attention", i)], example)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # the seam does not fit the layer's code
                self._block_support = (False, f"feeding layer {i}'s MLP block a state through "
                                              f"{structure.layers[i].seam} fails ({type(exc).__name__}): "
                                              "the MLP is judged with the whole layer")
                return
            want, got = cap[CheckpointKey("post_mlp", i)], replay.tensors.get(CheckpointKey("post_mlp", i))
            scale = float(want.abs().max()) if want.numel() else 0.0
            if got is None or not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * max(scale, 1.0)):
                self._block_support = (False, f"feeding layer {i}'s MLP block a state through "
                                              f"{structure.layers[i].seam} does not reproduce the layer")
                return

    def _kwargs(self, inputs: ModelInputs) -> dict[str, Any]:
        """The forward's keyword arguments: floating inputs (pixel values) in the module's dtype."""
        kwargs = inputs.torch(self.device)
        dtype = TORCH_DTYPES[self.dtype]
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in kwargs.items()}

    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        keys = self._keys(taps)
        self._check_inputs(inputs)
        wanted = set(keys)
        active = [t for t in self.taps if t.key in wanted]
        kwargs = self._kwargs(inputs)
        with torch.inference_mode(), HookCapture(
            self.module, active, layer_modules=self.layer_modules if capture_layer_inputs else None
        ) as cap, Timer(self.device) as timer:
            self.module(**kwargs)
        return Capture(
            tensors={k: cap.tensors[k] for k in keys if k in cap.tensors},
            backend=self.name,
            dtype=self.dtype,
            elapsed_s=timer.seconds,
            layer_inputs=cap.layer_inputs,
            meta={"modules": dict(self.structure.modules)} if self.structure is not None else {},
        )

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None,
                   tokens: np.ndarray | None = None) -> DecodeRun:
        """The prefill, then ``steps`` tokens decoded through the module's own cache
        (:func:`~debug_framework.backends.decode.module_decode`): teacher-forced with ``tokens``
        ``[batch, steps]``, else its own greedy choice."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        wanted = set(keys)
        active = [t for t in self.taps if t.key in wanted]
        meta = {"modules": dict(self.structure.modules)} if self.structure is not None else {}

        def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
            return Capture(tensors={k: tensors[k] for k in keys if k in tensors}, backend=self.name,
                           dtype=self.dtype, elapsed_s=seconds, meta=dict(meta))

        modules = dict(self.module.named_modules())  # walked once for every pass's capture
        return module_decode(self.name, self.module, self._kwargs(inputs),
                             lambda: HookCapture(self.module, active, modules=modules),
                             inputs, steps, tokens, self.dtype, wrap)

    def iter_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None,
                    prefill_taps: Taps = None) -> Iterator[DecodePass]:
        """:meth:`run_decode` pass by pass (:func:`~debug_framework.backends.decode.iter_module_decode`),
        the prefill capturing ``prefill_taps`` (default ``taps``); each pass under :meth:`_decode_context`."""
        keys = self._keys(taps)
        first = keys if prefill_taps is None else self._keys(prefill_taps)
        self._check_inputs(inputs)
        active = [t for t in self.taps if t.key in set(keys)]
        at_prefill = [t for t in self.taps if t.key in set(first)]
        meta = {"modules": dict(self.structure.modules)} if self.structure is not None else {}

        def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
            return Capture(tensors=dict(tensors), backend=self.name, dtype=self.dtype, elapsed_s=seconds, meta=dict(meta))

        modules = dict(self.module.named_modules())  # walked once for every pass's capture
        return iter_module_decode(self.name, self.module, self._kwargs(inputs),
                                  lambda: HookCapture(self.module, active, modules=modules),
                                  inputs, steps, tokens, wrap, lambda: HookCapture(self.module, at_prefill, modules=modules),
                                  self._decode_context, self._decode_draft)

    def _decode_context(self) -> ContextManager[object]:
        """What each pass of :meth:`iter_decode` runs under (nothing here; the float64 reference's exactness)."""
        return contextlib.nullcontext()

    def _decode_draft(self) -> torch.nn.Module | None:
        """The cheaper copy of the module whose greedy tokens let :meth:`iter_decode` compute several
        steps a pass (:mod:`._decode_draft`); None here: a backend under test decodes a step a pass
        (its decode is what is judged), only a reference may do otherwise."""
        return None

    def run_decode_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs, step: int, tokens: np.ndarray) -> Capture:
        """Layer ``i`` at decode ``step`` on ``hidden_in`` ``[B, 1, D]``: the prefill and the earlier
        steps (``tokens``) through the module's cache, then the step's pass with layer i's input
        replaced and stopped after it: its post_attention and post_mlp."""
        self._prepared()
        name = self.layer_modules[i]
        hidden = torch.as_tensor(hidden_in).to(self.device, TORCH_DTYPES[self.dtype])
        want = {CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)}
        active = [t for t in self.taps if t.key in want]
        passes = iter(range(step + 1))

        def capture() -> HookCapture:
            last = next(passes) == step
            return HookCapture(self.module, active, replace_input=(name, hidden), stop_after=name) if last \
                else HookCapture(self.module, [])

        def wrap(tensors: dict[CheckpointKey, Tensor], seconds: float) -> Capture:
            return Capture(tensors={k: v for k, v in tensors.items() if k in want}, backend=self.name,
                           dtype=self.dtype, elapsed_s=seconds)

        run = module_decode(self.name, self.module, self._kwargs(inputs), capture, inputs, step,
                            np.asarray(tokens)[:, :step], self.dtype, wrap)
        return run.captures[step]

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Run layer ``i`` on ``hidden_in`` (the model's own masks and positions are kept): the
        full forward is entered, layer i's input is replaced, and the pass stops after layer i."""
        self._prepared()
        name = self.layer_modules[i]
        hidden = torch.as_tensor(hidden_in).to(self.device, TORCH_DTYPES[self.dtype])
        want = {CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)}
        active = [t for t in self.taps if t.key in want]
        return self._replay(i, active, inputs, replace_input=(name, hidden), stop_after=name)

    def _earlier_layers(self, i: int) -> list[str]:
        """The layers of layer ``i``'s stack that run before it: a replay need not run them (their
        output is replaced by the replayed input), once :meth:`_replay` has seen that skipping them
        changes nothing for this model."""
        if self._skip_ok is False or not self.layer_modules:
            return []
        name = self.layer_modules[i]
        stack = name.rsplit(".", 1)[0]
        return [n for j, n in sorted(self.layer_modules.items()) if j < i and n.rsplit(".", 1)[0] == stack]

    def _replay(self, i: int, active: list[ModuleTap], inputs: ModelInputs, **hooks: Any) -> Capture:
        """One replay through the module's own forward, stopped after layer ``i``. The layers
        before it are skipped (a replay of layer i then costs one layer, not i + 1), after the first
        replay that could skip was run both ways and gave the same tensors bit for bit; a model
        whose layers depend on each other beyond their hidden state (or return more than it) keeps
        running them all."""
        skip = self._earlier_layers(i)

        def once(skipped: list[str]) -> Capture:
            with torch.inference_mode(), HookCapture(self.module, active, skip=skipped, **hooks) as cap, \
                    Timer(self.device) as timer:
                cap.run(self.module, **self._kwargs(inputs))
            return Capture(tensors=dict(cap.tensors), backend=self.name, dtype=self.dtype, elapsed_s=timer.seconds)

        if not skip:
            return once([])
        if self._skip_ok:
            return once(skip)
        full = once([])
        try:
            fast: Capture | None = once(skip)
        except Exception:  # noqa: BLE001 - the layers need more than their hidden state: never skip them
            fast = None
        self._skip_ok = fast is not None and set(fast.tensors) == set(full.tensors) and all(
            torch.equal(fast.tensors[k], full.tensors[k]) for k in full.tensors)
        return full

    def can_run_block(self) -> tuple[bool, str]:
        """Blocks run alone where the module follows the Hugging Face layout (the default map)."""
        if self.checkpoint_map is not None or self._layer_modules is not None:
            return False, "uses its own module map, so where its attention block ends is not known"
        return self._block_support if self.structure is not None else (True, "")

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` of layer ``i`` alone on its input, through the module's own code: for
        ``"mlp"`` the layer is entered with the attention block's result set to ``hidden_in`` (the
        post-attention state, see :func:`~debug_framework.capture.hooks.hf_attention_seam`) and
        stopped after the layer; ``"attention"`` is :meth:`run_layer`'s post_attention."""
        attention = attention_block_of_layer(self, i, hidden_in, inputs, block)
        if attention is not None:
            return attention
        self._prepared()
        ok, why = self.can_run_block()
        if not ok or self.architecture is None:
            raise BackendInitializationError(f"cannot run the MLP block alone: {why}", backend=self.name)
        name = self.layer_modules[i]
        state = torch.as_tensor(hidden_in).to(self.device, TORCH_DTYPES[self.dtype])
        if self.structure is not None:
            found = self.structure.layers[i].seam
            if found is None:
                raise BackendInitializationError(f"layer {i} has no seam for its MLP block", backend=self.name)
            seam, how = found
            if self.structure.layers[i].flat_state and state.dim() == 2:
                state = state.reshape(int(inputs.input_ids.shape[0]), -1, state.shape[-1])
        else:
            seam, how = hf_attention_seam(self.architecture, name)
        key = CheckpointKey("post_mlp", i)
        active = [t for t in self.taps if t.key == key]
        return self._replay(i, active, inputs, replace_input=(name, state), stop_after=name,
                            replace_output=(seam, state if how == "value" else torch.zeros_like(state)))
