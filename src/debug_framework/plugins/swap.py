"""Model-level swap-in: the PyTorch (Hugging Face eager) model with a plugin's kernels in place of
the operators they implement, as the validation backend ``plugin:<id>``.

* An ATen kernel (``aten::gelu``) replaces that operator for the whole forward pass, through a
  ``TorchDispatchMode`` active only while the backend runs (nothing global is overridden), for the
  dtypes and devices the kernel declares.
* A custom-op kernel with ``swap_module`` replaces the output of every module of that class (say
  ``LlamaRMSNorm``) by ``op(*args)``, each argument being the module's input or one of its attributes.

The engine then compares checkpoints as for any backend: the first divergence and the isolation
name the first layer where a swapped kernel changes the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.hooks import RemovableHandle

from ..backends.pytorch import PyTorchBackend
from ..capture.keys import Capture
from ..errors import BackendInitializationError
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from .loading import LoadedKernel, load_plugin
from .manifest import PluginDefinition

__all__ = ["PluginBackend", "AtenSwap", "module_swaps", "record_op_shapes"]


class AtenSwap(TorchDispatchMode):
    """Route ATen operators to plugin kernels (dtype and device permitting); count the calls."""

    def __init__(self, kernels: list[LoadedKernel]) -> None:
        super().__init__()
        self.table = {k.aten: k for k in kernels if k.aten is not None}
        self.calls: dict[str, int] = {}

    def _applies(self, k: LoadedKernel, args: tuple[object, ...]) -> bool:
        """The kernel takes this call: its first tensor's dtype and device are among the declared ones."""
        t = next((a for a in args if isinstance(a, torch.Tensor)), None)
        return t is not None and str(t.dtype).removeprefix("torch.") in k.spec.dtypes and t.device.type in k.spec.devices

    def __torch_dispatch__(self, func: OpOverload, types: Sequence[type], args: tuple[object, ...] = (),
                           kwargs: dict[str, object] | None = None) -> object:
        kwargs = kwargs or {}
        k = self.table.get(func)
        if k is not None and self._applies(k, args):
            self.calls[k.spec.name] = self.calls.get(k.spec.name, 0) + 1
            return k.op(*args, **kwargs)
        return func(*args, **kwargs)


def _module_hook(k: LoadedKernel, calls: dict[str, int]) -> Callable[..., torch.Tensor]:
    """A forward hook replacing the module's output by the kernel's (dtype and device permitting), counted."""

    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        x = inputs[0]
        if str(x.dtype).removeprefix("torch.") not in k.spec.dtypes or x.device.type not in k.spec.devices:
            return output
        calls[k.spec.name] = calls.get(k.spec.name, 0) + 1
        out = k.op(*_swap_args(k, module, x))
        assert isinstance(out, torch.Tensor)
        return out.to(output.dtype)

    return hook


def _swap_targets(module: torch.nn.Module, kernels: list[LoadedKernel]) -> Iterator[tuple[LoadedKernel, torch.nn.Module]]:
    """``(kernel, submodule)`` for every submodule of a class a ``swap_module`` kernel replaces."""
    for k in kernels:
        if k.spec.swap_module is None:
            continue
        for sub in module.modules():
            if type(sub).__name__ == k.spec.swap_module.cls:
                yield k, sub


def _swap_args(k: LoadedKernel, module: torch.nn.Module, x: torch.Tensor) -> list[object]:
    """The kernel's arguments for a module call: its input, then the module's attributes it names."""
    assert k.spec.swap_module is not None
    return [x if n == "input" else getattr(module, n) for n in k.spec.swap_module.args]


def module_swaps(module: torch.nn.Module, kernels: list[LoadedKernel], calls: dict[str, int]) -> list[RemovableHandle]:
    """Forward hooks putting each ``swap_module`` kernel in place of its modules' outputs; the handles."""
    return [sub.register_forward_hook(_module_hook(k, calls)) for k, sub in _swap_targets(module, kernels)]


class PluginBackend(PyTorchBackend):
    """``plugin:<id>``: Hugging Face eager PyTorch with the plugin's kernels swapped in."""

    def __init__(self, definition: PluginDefinition, artifact: str | Path, device: str = "cpu") -> None:
        super().__init__(device=device)
        self.name = f"plugin:{definition.id}"
        self.definition = definition
        self.artifact = Path(artifact)
        self.kernels: list[LoadedKernel] = []
        self.calls: dict[str, int] = {}
        self._handles: list[RemovableHandle] = []

    def version_info(self) -> dict[str, Any]:
        return {**super().version_info(), "plugin": self.definition.id, "plugin_version": self.definition.version,
                "plugin_backend": self.definition.backend_type, "artifact": str(self.artifact)}

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        super().prepare(model, dtype, device)
        self.kernels = list(load_plugin(self.definition, self.artifact).values())
        for h in self._handles:
            h.remove()
        assert self.module is not None
        self._handles = module_swaps(self.module, self.kernels, self.calls)
        swappable = [k for k in self.kernels if k.aten is not None or k.spec.swap_module is not None]
        if not swappable:
            raise BackendInitializationError("the plugin has no kernel that can be swapped into a model "
                                             "(an ATen op, or a custom op with swap_module)", backend=self.name)

    @contextmanager
    def _swapped(self) -> Iterator[None]:
        mode = AtenSwap(self.kernels)
        with mode:
            yield
        for name, n in mode.calls.items():
            self.calls[name] = self.calls.get(name, 0) + n

    def run(self, inputs: ModelInputs, taps: Any = None, *, capture_layer_inputs: bool = False) -> Capture:
        with self._swapped():
            return super().run(inputs, taps, capture_layer_inputs=capture_layer_inputs)

    def run_layer(self, i: int, hidden_in: Any, inputs: ModelInputs) -> Capture:
        with self._swapped():
            return super().run_layer(i, hidden_in, inputs)

    def run_block(self, i: int, block: str, hidden_in: Any, inputs: ModelInputs) -> Capture:
        with self._swapped():
            return super().run_block(i, block, hidden_in, inputs)


def record_op_shapes(module: torch.nn.Module, kernels: list[LoadedKernel], call: Callable[[], object],
                     limit: int = 8) -> dict[str, list[dict[str, list[int]]]]:
    """The argument shapes each kernel's operator sees during ``call()`` (a real model run): kernel ->
    up to ``limit`` distinct ``{tensor argument: shape}``, for the sweep's ``model`` samples."""
    from .samples import schema_of

    seen: dict[str, list[dict[str, list[int]]]] = {k.spec.name: [] for k in kernels}

    def note(k: LoadedKernel, args: list[object]) -> None:
        names = [a.name for a in schema_of(k.spec).arguments]
        shapes = {n: list(v.shape) for n, v in zip(names, args) if isinstance(v, torch.Tensor)}
        if shapes not in seen[k.spec.name] and len(seen[k.spec.name]) < limit:
            seen[k.spec.name].append(shapes)

    class Recorder(TorchDispatchMode):
        table = {k.aten: k for k in kernels if k.aten is not None}

        def __torch_dispatch__(self, func: OpOverload, types: Sequence[type], args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
            if func in self.table:
                note(self.table[func], list(args))
            return func(*args, **(kwargs or {}))

    def hook_for(k: LoadedKernel) -> Callable[..., None]:
        return lambda mod, inputs, output: note(k, _swap_args(k, mod, inputs[0]))

    handles = [sub.register_forward_hook(hook_for(k)) for k, sub in _swap_targets(module, kernels)]
    try:
        with torch.inference_mode(), Recorder():
            call()
    finally:
        for h in handles:
            h.remove()
    return seen


def model_shapes(defn: PluginDefinition, artifact: str | Path, model_path: str | Path, *, batch: int = 2,
                 length: int = 16, seed: int = 0) -> dict[str, list[dict[str, list[int]]]]:
    """The shapes each kernel's operator sees in one float32 forward pass of the model at
    ``model_path`` (seeded random tokens): the sweep's ``model`` samples."""
    from ..backends.pytorch import build_hf_model
    from ..modelio import load_model

    model = load_model(model_path)
    net = build_hf_model(model, torch.float32, "cpu")
    kernels = list(load_plugin(defn, artifact).values())
    vocab = int(model.raw_config.get("vocab_size") or 32)
    inputs = ModelInputs.random(vocab, batch, length, seed=seed).torch("cpu")
    return record_op_shapes(net, kernels, lambda: net(**inputs))
