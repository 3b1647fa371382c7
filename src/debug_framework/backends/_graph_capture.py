"""Checkpoints as extra outputs of one graph, for backends that compile or export a torch model.

Hooks cannot run inside generated code, so the Hugging Face model is wrapped once: forward hooks
(installed before tracing) append each checkpoint tensor to a list, and the wrapper returns that
list as a tuple. Tracing (Dynamo for ``inductor``, ``torch.export`` for the ONNX-graph engines) inlines
the hooks, so the checkpoints become ordinary outputs of a single graph: no graph break.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..capture.hooks import ModuleTap, find_module, first_input, first_tensor, hf_layer_modules, hf_module_taps
from ..capture.keys import CheckpointKey
from ..modelio.inputs import ModelInputs
from ..modelio.loader import LoadedModel
from ._graph_feeds import check_layer_index, graph_inputs, layer_inputs_from

__all__ = ["CheckpointOutputs", "PlainOutput", "layer_inputs_from", "graph_inputs", "check_layer_index", "replay_arguments",
           "layer_names", "generic_structure"]


class CheckpointOutputs(torch.nn.Module):
    """``forward(input_ids, attention_mask[, token_type_ids])`` -> a tuple, one tensor per checkpoint.

    ``keys[i]`` names output i (execution order of the taps: every checkpoint of the model).
    Calling one submodule alone (compiled or not) fires only the hooks inside it, still in that order,
    into ``_sink``: :meth:`keys_within` names them.
    """

    def __init__(self, net: torch.nn.Module, taps: list[ModuleTap]) -> None:
        super().__init__()
        self.net = net
        self.keys: list[CheckpointKey] = [t.key for t in taps]
        #: the module each output is tapped on (``modules[i]`` for ``keys[i]``)
        self.modules: list[str] = [t.module for t in taps]
        self._sink: list[torch.Tensor] = []
        #: a generic-tier model's structure (None for the from-math families)
        self.structure: Any = None
        sink = self._sink
        for tap in taps:
            module = find_module(net, tap.module)
            if tap.where == "output":
                module.register_forward_hook(lambda _m, _a, out, sink=sink: sink.append(first_tensor(out)))
            else:
                module.register_forward_pre_hook(
                    lambda _m, args, kwargs, sink=sink: sink.append(first_input(args, kwargs)), with_kwargs=True)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None):
        self._sink.clear()
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        self.net(**kwargs)
        out = tuple(self._sink)
        self._sink.clear()
        return out

    def keys_within(self, module: str) -> list[CheckpointKey]:
        """The checkpoints tapped on ``module`` or inside it, in the order their hooks fire."""
        return [k for k, m in zip(self.keys, self.modules, strict=True) if m == module or m.startswith(module + ".")]

    @classmethod
    def for_model(cls, net: torch.nn.Module, model: LoadedModel) -> CheckpointOutputs:
        """The wrapper with every checkpoint of a Hugging Face ``BertModel`` / ``*ForCausalLM``, or
        of a generic-tier model (found from its module structure: :func:`generic_structure`)."""
        if model.architecture == "generic":
            wrapper = cls(net, generic_structure(net, model).taps)
            wrapper.structure = generic_structure(net, model)
            return wrapper
        return cls(net, hf_module_taps(model.architecture, model.num_layers, model.router_layers))


class DecodeOutputs(torch.nn.Module):
    """One pass of a decode (the prefill or a step) through a model's own cache, for a compiler:
    ``forward(**kwargs)`` (the model's: ``input_ids``, ``attention_mask``, ``position_ids``, the cache)
    -> ``(checkpoints, logits, cache)``, the checkpoints in ``wrapper.keys``' order (its hooks)."""

    def __init__(self, wrapper: CheckpointOutputs) -> None:
        super().__init__()
        self.wrapper = wrapper
        self.eval()

    def forward(self, **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], Any, Any]:
        sink = self.wrapper._sink
        sink.clear()
        out = self.wrapper.net(**kwargs)
        checkpoints = tuple(sink)
        sink.clear()
        cache = getattr(out, "cache", None)
        return checkpoints, getattr(out, "logits", None), getattr(out, "past_key_values", None) if cache is None else cache


class CompiledPassCapture:
    """What ``backends.decode.module_decode`` expects of a hook capture (a context manager with
    ``run(module, **kwargs)`` and ``tensors``), for a compiled :class:`DecodeOutputs` ``fn``: the
    checkpoints come out of the compiled graph, not out of hooks added around it."""

    def __init__(self, fn: Any, keys: list[CheckpointKey]) -> None:
        self.fn, self.keys = fn, keys
        self.tensors: dict[CheckpointKey, torch.Tensor] = {}

    def __enter__(self) -> CompiledPassCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, _module: Any, **kwargs: Any) -> Any:
        from types import SimpleNamespace

        checkpoints, logits, cache = self.fn(**kwargs)
        self.tensors = dict(zip(self.keys, checkpoints))
        return SimpleNamespace(logits=logits, cache=cache)


class PlainOutput(torch.nn.Module):
    """The same model with only its final output (logits / last hidden state): no checkpoint outputs."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return first_tensor(self.net(**kwargs))


def generic_structure(net: torch.nn.Module, model: LoadedModel) -> Any:
    """The checkpoints of a generic-tier model found from its module structure (one eager forward
    on a small example; cached on the module). Graph backends take token inputs only: a model
    read from pixels or with a decoder's inputs is BackendInitializationError (DF002) saying so."""
    from ..capture.structure import discover
    from ..modelio.generic import random_inputs

    found = getattr(net, "_debug_framework_structure", None)
    if found is not None:
        return found
    kind = getattr(model.config, "input_kind", "tokens")
    if kind != "tokens":
        from ..errors import BackendInitializationError

        raise BackendInitializationError(
            f"a model read from {'pixels' if kind == 'pixels' else 'an encoder and a decoder input'} "
            "(generic tier) is run by the eager backends (pytorch, float64_eager) only: the graph backends "
            "trace a forward of token ids and mask", backend="graph capture")
    example = random_inputs(model.config, 1, 8, seed=0)  # type: ignore[arg-type]
    dtype = next((p.dtype for p in net.parameters()), torch.float32)
    device = next((p.device for p in net.parameters()), torch.device("cpu"))
    kwargs = {k: v.to(device) for k, v in example.torch().items()}
    found = discover(net, model.num_layers, {k: v.to(dtype) if v.is_floating_point() else v for k, v in kwargs.items()})
    net._debug_framework_structure = found  # type: ignore[assignment]
    return found


def layer_names(net: torch.nn.Module, model: LoadedModel) -> list[str]:
    """The module name of each layer: the Hugging Face names, or a generic-tier model's found ones."""
    if model.architecture == "generic":
        return [layer.module for layer in generic_structure(net, model).layers]
    return hf_layer_modules(model.architecture, model.num_layers)


class _LayerReached(Exception):
    """Stops the eager forward of :func:`_layer_call` as the layer is entered."""


def _layer_call(net: torch.nn.Module, layer: torch.nn.Module, net_kwargs: dict[str, torch.Tensor], backend: str,
                i: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments ``net(**net_kwargs)`` passes ``layer`` (its attention
    mask, rotary position embeddings ...): an eager forward, stopped as the layer is entered, so
    a backend can replay the layer alone on another hidden state. Hooks before the layer fire
    (a :class:`CheckpointOutputs` sink may need clearing afterwards). BackendRuntimeError (DF005,
    naming ``backend``) when the forward never enters layer ``i``."""
    seen: dict[str, Any] = {}

    def grab(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen["call"] = (args, kwargs)
        raise _LayerReached

    if "use_cache" in inspect.signature(net.forward).parameters:
        # no KV cache: a replayed layer must not append to (or read) the cache of the eager run
        net_kwargs = {**net_kwargs, "use_cache": False}
    handle = layer.register_forward_pre_hook(grab, with_kwargs=True, prepend=True)
    try:
        with torch.inference_mode():
            net(**net_kwargs)
    except _LayerReached:
        pass
    finally:
        handle.remove()
    if "call" not in seen:
        from ..errors import BackendRuntimeError

        raise BackendRuntimeError(f"the model's forward never called layer {i}, the one being replayed",
                                  backend=backend, call=f"run_layer({i})",
                                  hint="the layer module names must be the ones the model's forward calls")
    return seen["call"]


def _with_hidden(args: tuple[Any, ...], kwargs: dict[str, Any], hidden: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` of a layer call with ``hidden`` as its hidden state."""
    if args:
        return (hidden, *args[1:]), kwargs
    name = "hidden_states" if "hidden_states" in kwargs else next(
        (k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), "hidden_states")
    return args, {**kwargs, name: hidden}


def replay_arguments(net: torch.nn.Module, model: LoadedModel, i: int, inputs: ModelInputs, hidden: torch.Tensor,
                     sink: list[torch.Tensor], device: str, backend: str,
                     ) -> tuple[str, torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    """What a compiled backend needs to replay layer ``i`` of ``net`` on ``hidden``: the layer's
    module name, the module, and the arguments the model passes it for ``inputs`` with ``hidden``
    as its hidden state. ``sink`` (the checkpoint hooks' list) is left empty.

    Raises:
        BackendInitializationError: there is no layer ``i`` (DF002).
    """
    check_layer_index(model, i, backend)
    name = layer_names(net, model)[i]
    layer = find_module(net, name)
    arrays = graph_inputs(model, inputs)
    try:
        args, kwargs = _layer_call(net, layer, {k: torch.from_numpy(v).to(device) for k, v in arrays.items()},
                                   backend, i)
    finally:
        sink.clear()  # the eager run fired the checkpoint hooks before the layer
    args, kwargs = _with_hidden(args, kwargs, hidden)
    return name, layer, args, kwargs
