"""Checkpoint capture for ``torch.nn.Module`` models through forward hooks.

A :class:`ModuleTap` says "the output (or input) of module ``encoder.layer.3`` is checkpoint
``post_mlp:3``". :func:`hf_module_taps` gives the taps of the Hugging Face implementations;
:class:`HookCapture` installs them for one forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from ..errors import ConfigurationError, ValidationError
from .keys import CheckpointKey
from .spill import checkpoint_dict

T = TypeVar("T")

__all__ = ["first_input", "skipped_forward", "ModuleTap", "hf_module_taps", "hf_layer_modules", "hf_attention_seam", "hf_mlp_block", "find_module",
           "HookCapture", "first_tensor"]


@dataclass(frozen=True)
class ModuleTap:
    """Checkpoint ``key`` is the ``where`` ("output" or "input") of the module named ``module``."""

    module: str
    key: CheckpointKey
    where: Literal["output", "input"] = "output"


def hf_layer_modules(architecture: str, num_layers: int) -> list[str]:
    """The module name of each layer in the Hugging Face implementation."""
    if architecture == "bert":
        return [f"encoder.layer.{i}" for i in range(num_layers)]
    if architecture in ("llama", "gemma"):
        return [f"model.layers.{i}" for i in range(num_layers)]
    raise ConfigurationError(f"no Hugging Face module names known for architecture {architecture!r}")


def hf_module_taps(architecture: str, num_layers: int, router_layers: Iterable[int] = ()) -> list[ModuleTap]:
    """Every checkpoint of a Hugging Face ``BertModel``, ``LlamaForCausalLM``-style or Gemma model.
    Gemma's residual stream after attention is what its ``pre_feedforward_layernorm`` reads, and its
    logits are soft-capped after ``lm_head``: post_processing is the model's own output there. The
    layers in ``router_layers`` (a mixture of experts) give ``router_logits:i``: the first output of
    their ``mlp.gate`` (``[tokens, experts]``)."""
    layers = hf_layer_modules(architecture, num_layers)
    K = CheckpointKey
    if architecture == "bert":
        taps = [ModuleTap("embeddings", K("post_embedding"))]
        for i, m in enumerate(layers):
            taps += [ModuleTap(f"{m}.attention", K("post_attention", i)), ModuleTap(m, K("post_mlp", i))]
        return taps + [ModuleTap(layers[-1], K("post_processing"))]
    taps = [ModuleTap("model.embed_tokens", K("post_embedding"))]
    gemma = architecture == "gemma"
    routed = set(router_layers)
    for i, m in enumerate(layers):
        # The residual stream after attention is what the (pre-feed-forward) norm reads.
        norm = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
        taps.append(ModuleTap(f"{m}.{norm}", K("post_attention", i), "input"))
        if i in routed:
            taps.append(ModuleTap(f"{m}.mlp.gate", K("router_logits", i)))
        taps.append(ModuleTap(m, K("post_mlp", i)))
    return taps + [ModuleTap("" if gemma else "lm_head", K("post_processing"))]


def hf_attention_seam(architecture: str, layer_module: str) -> tuple[str, Literal["value", "zero"]]:
    """Where layer ``layer_module``'s MLP block can be fed a given post-attention state, in the
    Hugging Face implementation: ``(module, how)``. ``"value"``: that module's output *is* the
    post-attention state (post-LN BERT's ``attention``), replace it by the state; ``"zero"``: that
    module's output is added to the layer's input to make it (pre-norm Llama's ``self_attn``), so the
    layer is fed the state as its input and that output is replaced by zeros (exact: ``a + 0 = a``)."""
    if architecture == "bert":
        return f"{layer_module}.attention", "value"
    if architecture in ("llama", "gemma"):  # Gemma's post-attention norm of zeros is zero
        return f"{layer_module}.self_attn", "zero"
    raise ValidationError(f"no Hugging Face attention module known for architecture {architecture!r}")


class _HFMLPBlock(torch.nn.Module):
    """A Hugging Face layer's MLP block: ``forward(a)`` maps the post-attention state ``a`` to the
    layer's output (``post_mlp``) through the layer's own submodules (see :func:`hf_mlp_block`)."""

    def __init__(self, architecture: str, layer: torch.nn.Module) -> None:
        super().__init__()
        self.architecture = architecture
        self.layer = layer
        self._chunked: Callable[..., torch.Tensor] | None = None
        if architecture == "bert" and getattr(layer, "chunk_size_feed_forward", 0):
            from transformers.pytorch_utils import apply_chunking_to_forward

            self._chunked = apply_chunking_to_forward
        self.eval()

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        if self.architecture == "llama":
            # LlamaDecoderLayer / Qwen2DecoderLayer: residual = h; h = norm(h); h = mlp(h); h = residual + h
            return a + layer.mlp(layer.post_attention_layernorm(a))
        if self.architecture == "gemma":  # Gemma2/3DecoderLayer: norms before and after the MLP
            return a + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(a)))
        if self._chunked is not None:  # BertLayer.forward, feed-forward chunking on
            return self._chunked(layer.feed_forward_chunk, layer.chunk_size_feed_forward, layer.seq_len_dim, a)
        return layer.feed_forward_chunk(a)  # BertLayer: output(intermediate(a), a) = LayerNorm(dense(.) + a)


def hf_mlp_block(architecture: str, layer: torch.nn.Module) -> torch.nn.Module:
    """Layer ``layer``'s (a Hugging Face layer module) MLP block as a module of its own whose
    ``forward(a)`` takes the post-attention state ``a`` and returns the layer's output, computed by
    the layer's own submodules exactly as the layer's forward writes it (same operations, same
    residual order): pre-norm Llama / Qwen2 ``a + mlp(post_attention_layernorm(a))``; post-LN BERT
    ``feed_forward_chunk(a)`` = ``output(intermediate(a), a)`` = ``LayerNorm(dense(.) + a)``, chunked
    where the layer chunks. The module shares the layer's parameters (nothing is copied); hooks on
    those submodules fire when it runs (e.g. a checkpoint pre-hook on Llama's
    ``post_attention_layernorm``), hooks on the layer itself do not. Gemma:
    ``a + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(a)))``."""
    if architecture not in ("llama", "gemma", "bert"):
        raise ValidationError(f"no Hugging Face MLP block known for architecture {architecture!r}")
    return _HFMLPBlock(architecture, layer)


def find_module(root: torch.nn.Module, name: str, modules: Mapping[str, torch.nn.Module] | None = None) -> torch.nn.Module:
    """The submodule ``name``, or the one whose dotted name ends with ``.name`` (e.g. under ``bert.``);
    ``modules``: ``dict(root.named_modules())`` when the caller already has it (looking up many names)."""
    if modules is None:
        modules = dict(root.named_modules())
    if name in modules:
        return modules[name]
    matches = [m for n, m in modules.items() if n.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    raise ConfigurationError(
        f"module {name!r} not found in {type(root).__name__}" + (" (ambiguous)" if matches else ""),
        hint="pass an explicit module-to-checkpoint map naming modules of your model",
        checkpoint=name,
    )


def first_tensor(value: object) -> torch.Tensor:
    """The tensor a module returned: itself, the first of a tuple, or the first field of a ModelOutput."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)) and value:
        return first_tensor(value[0])
    raise ValidationError(f"module returned {type(value).__name__}, not a tensor")


def first_input(args: tuple[object, ...], kwargs: Mapping[str, object]) -> object:
    """The hidden state a module was called with: its first positional argument, else its
    ``hidden_states`` keyword, else its first tensor keyword (DistilBERT's ``x=``); None without one."""
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)


def _with_first_input(args: tuple[object, ...], kwargs: dict[str, object], value: torch.Tensor
                      ) -> tuple[tuple[object, ...], dict[str, object]]:
    """``(args, kwargs)`` with the hidden state (see :func:`first_input`) replaced by ``value`` in its dtype."""
    if args:
        return (value.to(args[0].dtype), *args[1:]), kwargs
    name = "hidden_states" if "hidden_states" in kwargs else next(
        (k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
    if name is None:
        raise ValidationError("the layer was called without a hidden state to replace")
    return args, {**kwargs, name: value.to(kwargs[name].dtype)}


class _StopForward(Exception):
    """Raised by a hook to end a forward pass early (single-layer replay)."""


def skipped_forward(*args: object, **kwargs: object) -> object:
    """The forward of a module a replay skips (``HookCapture(skip=...)``): the hidden state it was
    given. A streamed model converts no weights for a module whose forward this is."""
    return first_input(args, kwargs)


class HookCapture:
    """Install forward hooks for one run; ``tensors`` and ``layer_inputs`` fill in as the model runs.

    Args:
        root: the model.
        taps: which module outputs/inputs are which checkpoints.
        layer_modules: module name per layer index, to record each layer's input (optional).
        replace_input: ``(layer module name, tensor)``: feed this hidden state to that module instead
            of what it receives (replay of a single layer).
        stop_after: end the forward pass once this module has run (raises inside, caught by ``run``).
        replace_output: ``(module name, tensor)``: that module's output (its first tensor) becomes
            this tensor, in the output's dtype (the seam of a block replay).
        skip: modules that do not run: each returns the hidden state it was given (the layers before
            a replayed one, whose outputs the replay replaces anyway; the caller checks once that
            skipping gives the same replay, see ``TorchModuleBackend``).
        modules: ``dict(root.named_modules())``, where the caller already has it: every name is
            looked up there instead of walking the model again on each entry (a decode enters a
            capture once a pass: it computes the map once for all of them). It must be the model's
            modules as they are: a caller that adds or replaces a submodule computes it anew.
    """

    def __init__(
        self,
        root: torch.nn.Module,
        taps: Iterable[ModuleTap],
        *,
        layer_modules: Mapping[int, str] | None = None,
        replace_input: tuple[str, torch.Tensor] | None = None,
        stop_after: str | None = None,
        replace_output: tuple[str, torch.Tensor] | None = None,
        skip: Iterable[str] = (),
        modules: Mapping[str, torch.nn.Module] | None = None,
    ) -> None:
        self.root = root
        self.modules = modules
        self.taps = list(taps)
        self.layer_modules = dict(layer_modules or {})
        self.replace_input = replace_input
        self.stop_after = stop_after
        self.replace_output = replace_output
        self.skip = list(skip)
        self._skipped: list[tuple[torch.nn.Module, Callable[..., object] | None]] = []  # (module, its own instance forward or None)
        # within the run's capture budget where one is active (spilled to disk beyond it: .spill)
        self.tensors: MutableMapping[CheckpointKey, torch.Tensor] = checkpoint_dict()
        self.layer_inputs: MutableMapping[int, torch.Tensor] = checkpoint_dict()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> HookCapture:
        # walked once for every name below, or not at all where the caller gave the map
        modules = self.modules if self.modules is not None else dict(self.root.named_modules())

        def find(name: str) -> torch.nn.Module:
            return find_module(self.root, name, modules)

        for tap in self.taps:
            mod = find(tap.module)
            key = tap.key
            if tap.where == "output":
                def out_hook(_m, _args, output, key=key):
                    self.tensors[key] = first_tensor(output).detach()
                self._handles.append(mod.register_forward_hook(out_hook))
            else:
                def in_hook(_m, args, kwargs, key=key):
                    self.tensors[key] = first_input(args, kwargs).detach()
                self._handles.append(mod.register_forward_pre_hook(in_hook, with_kwargs=True))
        for i, name in self.layer_modules.items():
            def layer_in(_m, args, kwargs, i=i):
                self.layer_inputs[i] = first_input(args, kwargs).detach()
            self._handles.append(find(name).register_forward_pre_hook(layer_in, with_kwargs=True))
        if self.replace_input is not None:
            name, hidden = self.replace_input

            def swap(_m, args, kwargs):
                return _with_first_input(args, kwargs, hidden)

            # prepend so that layer-input recording sees the replayed state
            self._handles.append(find(name).register_forward_pre_hook(swap, with_kwargs=True, prepend=True))
        if self.replace_output is not None:
            out_name, value = self.replace_output

            def put(_m, _args, output):
                first = first_tensor(output)
                new = value.to(first.dtype)
                if isinstance(output, torch.Tensor):
                    return new
                if isinstance(output, tuple):
                    return (new, *output[1:])
                raise ValidationError(f"module {out_name!r} returned {type(output).__name__}; a block replay "
                                      "can only replace a tensor or the first item of a tuple")
            self._handles.append(find(out_name).register_forward_hook(put, prepend=True))
        for name in self.skip:
            mod = find(name)
            self._skipped.append((mod, mod.__dict__.get("forward")))
            mod.forward = skipped_forward  # type: ignore[method-assign]
        if self.stop_after is not None:
            def stop(_m, _args, _output):
                raise _StopForward
            self._handles.append(find(self.stop_after).register_forward_hook(stop))
        return self

    def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T | None:
        """Call ``fn`` (the forward), swallowing the early stop of ``stop_after``."""
        try:
            return fn(*args, **kwargs)
        except _StopForward:
            return None

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, own in self._skipped:  # the forward it had again
            if own is None:
                del mod.forward
            else:
                mod.forward = own
        self._skipped.clear()
