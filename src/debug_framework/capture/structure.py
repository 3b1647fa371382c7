"""Checkpoints found from a model's module structure (the generic tier).

:func:`discover` takes any ``torch.nn.Module`` of the ``transformers`` kind (a stack of layers,
each with an attention block and an MLP or mixture-of-experts block) and one forward pass on a
small example, and returns the :class:`ModelStructure`: which module is each layer, where each
canonical checkpoint is (``post_embedding``, ``post_attention:i``, ``post_mlp:i``,
``router_logits:i``, ``post_processing``) and where a layer's MLP block can be fed a given state.

The roles are read from what the forward pass does, not from a table of families: the order in
which each layer calls its submodules and which tensor each one receives (by identity). So

* a norm called before the attention on the layer's input makes the layer *pre-norm*; its
  residual stream after attention is the input of the norm that feeds the MLP (Llama, Mistral,
  GPT-2, ViT, Gemma 2's ``pre_feedforward_layernorm``);
* otherwise (post-LN encoders, OLMo 2's norms after each block, T5's sublayers) it is the MLP
  block's own input;
* an MLP whose input was computed before the attention ran is a *parallel* block (GPT-NeoX, Phi,
  Falcon): ``post_attention:i`` is then the attention block's output (the MLP does not read a
  post-attention residual), and the MLP is judged with the whole layer;
* a layer without an MLP child (OPT, BART: ``fc1``, activation, ``fc2`` written inline) starts its
  MLP block at the first module with weights that it calls after its last attention;
* a mixture-of-experts block's router (its ``gate``/``router`` child) gives ``router_logits:i``.

A model whose layers cannot be found (no stack of ``num_hidden_layers`` identical modules, no
attention or MLP call in a layer) is a ``ModelLoadingError`` (DF004) saying what is missing and
how to map the model yourself (``module_backend(..., checkpoint_map=...)``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..errors import ModelLoadingError
from .hooks import ModuleTap, first_input, first_tensor
from .keys import CheckpointKey

__all__ = ["LayerStructure", "ModelStructure", "discover", "layer_stacks", "static_router", "MAP_HINT"]

#: How to run a model whose structure is not found (the same advice as the loader's).
MAP_HINT = ("map its modules yourself: debug_framework.module_backend(name, builder, checkpoint_map="
            "{'model.layers.0': 'post_mlp:0', ...}, layer_modules={0: 'model.layers.0', ...}) "
            "(docs/models-and-backends.md, 'Map your own model')")

_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_MLP_NAME = re.compile(r"^(mlp|feed_forward|ffn|ff|block_sparse_moe|moe|intermediate|experts|mixer_mlp)$")
_MLP_CLASS = re.compile(r"MLP|Mo[Ee]|FeedForward|LayerFF|Intermediate|Experts|FFN")
_NORM = re.compile(r"norm|^ln", re.IGNORECASE)
_ROUTER = ("gate", "router")


@dataclass(frozen=True)
class LayerStructure:
    """One layer as the forward pass showed it.

    Attributes:
        module: the layer's module path.
        attention: the attention block (the last one called before the MLP: T5's cross-attention).
        mlp: the MLP or mixture-of-experts block.
        post_attention: where ``post_attention:i`` is taken.
        parallel: attention and MLP read the same input (the MLP is judged with the whole layer).
        seam: where the MLP block can be fed a state: ``(module, "value")`` (that module's output is
            the post-attention state) or ``(attention, "zero")`` (its output is added to the layer's
            input; the layer is fed the state and the attention's output is replaced by zeros);
            None for a parallel layer.
        router: the router of a mixture-of-experts block (``router_logits:i``), if any.
        pre_norm: a norm reads the layer's input before the attention.
    """

    module: str
    attention: str
    mlp: str
    post_attention: ModuleTap
    parallel: bool = False
    seam: tuple[str, Literal["value", "zero"]] | None = None
    router: str | None = None
    pre_norm: bool = False
    #: the layer flattens its post-attention state to ``[tokens, hidden]`` before the MLP (OPT):
    #: a state fed through the seam is given the layer input's ``[batch, tokens, hidden]`` back
    flat_state: bool = False


@dataclass
class ModelStructure:
    """Where the checkpoints of a model are (see :func:`discover`).

    Attributes:
        layers: each layer, in execution order (an encoder-decoder's decoder layers follow its encoder's).
        taps: every checkpoint as a module input or output.
        modules: checkpoint id -> the module path recorded with its result.
        num_experts_per_token: the routers' top-k (mixture of experts), else 0.
    """

    layers: list[LayerStructure]
    taps: list[ModuleTap]
    modules: dict[str, str] = field(default_factory=dict)
    num_experts_per_token: int = 0

    @property
    def layer_modules(self) -> dict[int, str]:
        return {i: layer.module for i, layer in enumerate(self.layers)}

    def router_layers(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.router is not None]


def _stacks(net: torch.nn.Module) -> list[tuple[str, torch.nn.ModuleList]]:
    """ModuleLists of identical modules that hold parameters, outermost first in model order."""
    found: list[tuple[str, torch.nn.ModuleList]] = []
    for name, mod in net.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) == 0:
            continue
        if any(name.startswith(outer + ".") for outer, _ in found):
            continue
        kinds = {type(m) for m in mod}
        if len(kinds) == 1 and len(list(mod[0].modules())) >= 3 and any(True for _ in mod[0].parameters()):
            found.append((name, mod))
    return found


def layer_stacks(net: torch.nn.Module, num_layers: int) -> list[str]:
    """The module path of every layer: one stack of ``num_layers`` identical modules, or stacks
    (encoder then decoder) whose lengths add up to it; DF004 when none fits."""
    stacks = _stacks(net)
    for name, mod in stacks:
        if len(mod) == num_layers:
            return [f"{name}.{i}" for i in range(num_layers)]
    for a in range(len(stacks)):
        for b in range(a + 1, len(stacks)):
            if len(stacks[a][1]) + len(stacks[b][1]) == num_layers:
                return [f"{n}.{i}" for n, m in (stacks[a], stacks[b]) for i in range(len(m))]
    seen = ", ".join(f"{n} ({len(m)})" for n, m in stacks) or "none"
    raise ModelLoadingError(
        f"no stack of {num_layers} layers found in {type(net).__name__} (module lists of identical layers: {seen})",
        hint=MAP_HINT)


@dataclass
class _Call:
    name: str
    module: torch.nn.Module
    inp: torch.Tensor | None
    out: torch.Tensor | None
    order: int


def _candidates(layer: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """A layer's direct children, with the children of a ModuleList/Sequential child (T5's sublayers)."""
    out: list[tuple[str, torch.nn.Module]] = []
    for name, child in layer.named_children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            out += [(f"{name}.{n}", c) for n, c in child.named_children()]
        else:
            out.append((name, child))
    return out


def _probe(net: torch.nn.Module, layers: list[str], example: Mapping[str, object]) -> tuple[
        dict[str, list[_Call]], dict[str, tuple[object, torch.Tensor | None]], object]:
    """One forward pass recording, per layer, the calls of its children in order (their first
    input and first output tensors) and the layer's own input and output."""
    modules = dict(net.named_modules())
    calls: dict[str, list[_Call]] = {name: [] for name in layers}
    ends: dict[str, tuple[object, torch.Tensor | None]] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []
    counter = [0]

    def tensor(value: object) -> torch.Tensor | None:
        try:
            return first_tensor(value)
        except Exception:  # a module returning something without a tensor (None, a cache)
            return None

    for lname in layers:
        layer = modules[lname]
        for cname, child in _candidates(layer):
            record = calls[lname]

            def hook(mod: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object,
                     cname: str = cname, record: list[_Call] = record) -> None:
                if any(c.name == cname for c in record):
                    return
                counter[0] += 1
                record.append(_Call(cname, mod, first_input(args, kwargs), tensor(output), counter[0]))
            handles.append(child.register_forward_hook(hook, with_kwargs=True))

        def lhook(mod: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object,
                  lname: str = lname) -> None:
            ends.setdefault(lname, (first_input(args, kwargs), tensor(output)))
        handles.append(layer.register_forward_hook(lhook, with_kwargs=True))
    try:
        with torch.inference_mode():
            result = net(**example)
    finally:
        for h in handles:
            h.remove()
    return calls, ends, result


def _is_passive(call: _Call) -> bool:
    """Dropout, activations, identities: modules that take no part in a block's role."""
    if isinstance(call.module, (torch.nn.Dropout, torch.nn.Identity)):
        return True
    return not _is_norm(call) and not any(True for _ in call.module.parameters())


def _is_norm(call: _Call) -> bool:
    return bool(_NORM.search(call.name.rsplit(".", 1)[-1]) or "Norm" in type(call.module).__name__)


def _same(a: object, b: object) -> bool:
    return a is not None and b is not None and a is b


def _layer(lname: str, calls: list[_Call], layer_in: object) -> LayerStructure:
    names = ", ".join(c.name for c in calls) or "none"
    calls = [c for c in calls if not _is_passive(c)]
    attn_calls = [c for c in calls if not _is_norm(c) and (_ATTENTION.search(c.name.rsplit(".", 1)[-1])
                                                            or _ATTENTION.search(type(c.module).__name__))]
    mlp_calls = [c for c in calls if c not in attn_calls and not _is_norm(c)
                 and (_MLP_NAME.match(c.name.rsplit(".", 1)[-1]) or _MLP_CLASS.search(type(c.module).__name__))]
    if attn_calls and not mlp_calls:
        # an MLP written inline in the layer (OPT, BART, XGLM: fc1, activation, fc2 as the layer's own
        # children): the block starts at the first module with weights called after the last attention
        mlp_calls = [c for c in calls if c.order > attn_calls[-1].order and c not in attn_calls and not _is_norm(c)]
    if not attn_calls or not mlp_calls:
        missing = "attention block" if not attn_calls else "MLP block"
        raise ModelLoadingError(f"layer {lname!r} has no recognisable {missing} (its submodules, in call order: "
                                f"{names})", hint=MAP_HINT)
    mlp = mlp_calls[0]
    before = [c for c in attn_calls if c.order < mlp.order]
    attention = before[-1] if before else attn_calls[0]
    first_attention = attn_calls[0]
    pre_norm = any(_is_norm(c) and c.order < first_attention.order and _same(c.inp, layer_in) for c in calls)
    # what was computed before the attention ran (the layer's input, and what came from it alone)
    early = [layer_in] + [c.out for c in calls if c.order < first_attention.order]
    for c in calls:
        if first_attention.order < c.order < mlp.order and any(_same(c.inp, t) for t in early):
            early.append(c.out)
    router = next((f"{lname}.{mlp.name}.{sub}" for sub, _ in mlp.module.named_children() if sub in _ROUTER), None)
    if any(_same(mlp.inp, t) for t in early):  # the MLP never saw the attention's result
        return LayerStructure(lname, f"{lname}.{attention.name}", f"{lname}.{mlp.name}",
                              ModuleTap(f"{lname}.{attention.name}", CheckpointKey("post_attention", 0)),
                              parallel=True, router=router, pre_norm=pre_norm)
    feeder = next((c for c in calls if c.order < mlp.order and _same(c.out, mlp.inp)), None)
    if pre_norm and feeder is not None and _is_norm(feeder) and not _same(feeder.inp, attention.out):
        where, state = ModuleTap(f"{lname}.{feeder.name}", CheckpointKey("post_attention", 0), "input"), feeder.inp
    else:
        where, state = ModuleTap(f"{lname}.{mlp.name}", CheckpointKey("post_attention", 0), "input"), mlp.inp
    producer = next((c for c in calls if c.order < mlp.order and _same(c.out, state)), None)
    seam: tuple[str, Literal["value", "zero"]] = (
        (f"{lname}.{producer.name}", "value") if producer is not None else (f"{lname}.{attention.name}", "zero"))
    flat = isinstance(state, torch.Tensor) and isinstance(layer_in, torch.Tensor) and state.dim() < layer_in.dim()
    return LayerStructure(lname, f"{lname}.{attention.name}", f"{lname}.{mlp.name}", where, seam=seam,
                          router=router, pre_norm=pre_norm, flat_state=flat)


def static_router(layer: torch.nn.Module) -> str | None:
    """The router of a layer's mixture-of-experts block without running it (the loader's view):
    a ``gate``/``router`` child of the child that is its MLP block, as a path inside the layer."""
    for name, child in _candidates(layer):
        if _MLP_NAME.match(name.rsplit(".", 1)[-1]) or _MLP_CLASS.search(type(child).__name__):
            sub = next((s for s, _ in child.named_children() if s in _ROUTER), None)
            if sub is not None:
                return f"{name}.{sub}"
    return None


def _module_name(net: torch.nn.Module, target: object) -> str | None:
    if target is None:
        return None
    return next((n for n, m in net.named_modules() if m is target), None)


def discover(net: torch.nn.Module, num_layers: int, example: Mapping[str, object], *,
             experts_per_token: int = 0) -> ModelStructure:
    """The structure of ``net`` from one forward pass on ``example`` (keyword arguments of its
    forward); see the module's documentation. DF004 (with how to map the model yourself) when the
    layers, or a layer's attention or MLP block, cannot be found."""
    K = CheckpointKey
    names = layer_stacks(net, num_layers)
    calls, ends, _ = _probe(net, names, example)
    missing = [n for n in names if n not in ends]
    if missing:
        raise ModelLoadingError(f"the forward pass never ran layer {missing[0]!r} as a module call (a model that "
                                "calls its layers' .forward() directly bypasses the hooks checkpoints are "
                                "taken with)", hint=MAP_HINT)
    layers = [_layer(n, calls[n], ends[n][0]) for n in names]
    embed = _module_name(net, net.get_input_embeddings()) if hasattr(net, "get_input_embeddings") else None
    head = None
    if hasattr(net, "get_output_embeddings"):
        try:
            head = _module_name(net, net.get_output_embeddings())
        except (AttributeError, NotImplementedError):
            head = None
    taps = [ModuleTap(names[0], K("post_embedding"), "input")]
    modules = {"post_embedding": embed or f"{names[0]} (input)"}
    for i, layer in enumerate(layers):
        pa = layer.post_attention
        taps.append(ModuleTap(pa.module, K("post_attention", i), pa.where))
        modules[str(K("post_attention", i))] = pa.module + (" (input)" if pa.where == "input" else "")
        if layer.router is not None:
            taps.append(ModuleTap(layer.router, K("router_logits", i)))
            modules[str(K("router_logits", i))] = layer.router
        taps.append(ModuleTap(layer.module, K("post_mlp", i)))
        modules[str(K("post_mlp", i))] = layer.module
    taps.append(ModuleTap("", K("post_processing")))
    modules["post_processing"] = head or f"{type(net).__name__} (output)"
    return ModelStructure(layers, taps, modules, experts_per_token)
