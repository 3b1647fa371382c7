"""The injected bugs of the judgement suite (tests/judgement) and of ``bench_diagnosis``: each a
``module_backend`` around the Hugging Face eager model with one mistake made in ONE layer
(:data:`BUG_LAYER`), as a backend engineer's own PyTorch implementation would have it.

A bug is ``patch(net, layer_index)``, applied to the built ``transformers`` model. Attention bugs go
through a per-layer attention function (:func:`attention`): the layer's attention module gets its
own copy of the config naming a registered ``AttentionInterface`` entry, so the other layers keep
the eager path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from debug_framework.backends import module_backend, register_backend
from debug_framework.backends.pytorch import build_hf_model
from debug_framework.capture import CheckpointKey

from benchmarks.models.tiny_transformers import WINDOW as TINY_WINDOW

BUG_LAYER = 1


def _layers(net: torch.nn.Module) -> Any:
    return net.model.layers if hasattr(net, "model") else net.encoder.layer


def _attn_module(net: torch.nn.Module, i: int) -> torch.nn.Module:
    layer = _layers(net)[i]
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attention.self


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float, *, softmax_dtype: torch.dtype = torch.float32,
              tile_kv: bool = False, mask_fn: Callable[[torch.Tensor | None], torch.Tensor | None] | None = None,
              **_: Any) -> tuple[torch.Tensor, None]:
    """Eager attention as transformers computes it, with the knobs the bugs turn."""
    group = query.shape[1] // key.shape[1]
    if group > 1:  # each key/value head serves `group` query heads: h -> h // group (tiling is the bug)
        expand = (lambda t: t.repeat(1, group, 1, 1)) if tile_kv else (lambda t: t.repeat_interleave(group, dim=1))
        key, value = expand(key), expand(value)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    mask = mask_fn(attention_mask) if mask_fn is not None else attention_mask
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    probs = torch.softmax(scores.to(softmax_dtype), dim=-1).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


def _use_attention(net: torch.nn.Module, i: int, name: str, **knobs: Any) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(name, lambda *a, **kw: attention(*a, **{**kw, **knobs}))
    module = _attn_module(net, i)
    module.config = copy.copy(module.config)
    module.config._attn_implementation = name


def _future_token(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Off by one in the causal mask: query i also sees key i + 1."""
    if mask is None:
        return None
    out = mask.clone()
    t = out.shape[-1]
    idx = torch.arange(t - 1)
    out[..., idx, idx + 1] = True if out.dtype == torch.bool else 0.0
    return out


def _padding_off_by_one(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Off by one in the padding mask: key j is allowed when key j + 1 is (the last real token is lost)."""
    if mask is None:
        return None
    out = mask.clone()
    out[..., :-1] = mask[..., 1:]
    return out


def _rope_interleaved(net: torch.nn.Module, i: int) -> None:
    """The GPT-J rotary layout (frequencies interleaved) in a model written for rotate-half."""

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        cos, sin = kwargs["position_embeddings"]
        half = cos.shape[-1] // 2
        swap = (lambda t: t[..., :half].repeat_interleave(2, dim=-1))
        return args, {**kwargs, "position_embeddings": (swap(cos), swap(sin))}

    _layers(net)[i].register_forward_pre_hook(hook, with_kwargs=True)


def _fill(param: torch.Tensor, value: float) -> None:
    with torch.no_grad():
        param.fill_(value)


def _gelu_tanh(net: torch.nn.Module, i: int) -> None:
    from transformers.activations import ACT2FN

    _layers(net)[i].intermediate.intermediate_act_fn = ACT2FN["gelu_pytorch_tanh"]


def _drop_q_norm(net: torch.nn.Module, i: int) -> None:
    """Qwen3 / Gemma 3: the per-head RMS norm of the queries forgotten."""
    _attn_module(net, i).q_norm = torch.nn.Identity()


def _swap_experts(net: torch.nn.Module, i: int) -> None:
    """A mixture of experts whose experts 0 and 1 are loaded in each other's place."""
    experts = _layers(net)[i].mlp.experts
    with torch.no_grad():
        for param in (experts.gate_up_proj, experts.down_proj):
            param.copy_(param[[1, 0, *range(2, param.shape[0])]])


def _norm_without_offset(net: torch.nn.Module, i: int) -> None:
    """Gemma's ``(1 + w)`` RMS norm computed as ``w``: the input norm's stored weight read as the scale."""
    norm = _layers(net)[i].input_layernorm
    with torch.no_grad():
        norm.weight.sub_(1.0)  # (1 + (w - 1)) = w


def _gemma_head_dim_scale(net: torch.nn.Module, i: int) -> None:
    """Gemma's attention scaled by ``head_dim ** -0.5`` instead of ``query_pre_attn_scalar ** -0.5``."""
    module = _attn_module(net, i)
    module.scaling = module.head_dim ** -0.5


def _window_off_by_one(mask: torch.Tensor | None, window: int = TINY_WINDOW) -> torch.Tensor | None:
    """Off by one in the sliding window: query i also sees key i - window."""
    if mask is None:
        return None
    out = mask.clone()
    t = out.shape[-1]
    idx = torch.arange(max(t - window, 0))
    out[..., idx + window, idx] = True if out.dtype == torch.bool else 0.0
    return out


@dataclass(frozen=True)
class Bug:
    """One injected bug: what it breaks, where it first shows, and which families/dtypes it applies to."""

    name: str
    patch: Callable[[torch.nn.Module, int], None]
    first: str  # the checkpoint name it first shows at, in layer BUG_LAYER
    families: tuple[str, ...]
    dtypes: tuple[str, ...] = ("float32", "bfloat16")


BUGS: dict[str, Bug] = {b.name: b for b in (
    Bug("attention_scale", lambda n, i: setattr(_attn_module(n, i), "scaling", 1.0 / _attn_module(n, i).head_dim
                                                if hasattr(_attn_module(n, i), "head_dim")
                                                else 1.0 / _attn_module(n, i).attention_head_size),
        "post_attention", ("llama", "qwen2", "bert", "mistral", "qwen3", "phi3", "qwen3_moe")),
    # Gemma 2's soft-cap squashes the scores the scale acts on: within a correct bfloat16 run's noise
    Bug("gemma_head_dim_scale", _gemma_head_dim_scale, "post_attention", ("gemma2", "gemma3_text"), ("float32",)),
    Bug("dropped_q_norm", _drop_q_norm, "post_attention", ("qwen3", "qwen3_moe", "gemma3_text")),
    Bug("swapped_expert", _swap_experts, "post_mlp", ("qwen3_moe",)),
    Bug("missing_attention_softcap", lambda n, i: setattr(_attn_module(n, i), "attn_logit_softcapping", None),
        "post_attention", ("gemma2",)),
    Bug("norm_without_offset", _norm_without_offset, "post_attention", ("gemma2", "gemma3_text")),
    Bug("sliding_window_off_by_one", lambda n, i: _use_attention(n, i, "df_bug_window", mask_fn=_window_off_by_one),
        "post_attention", ("mistral", "qwen3", "phi3")),
    Bug("dropped_norm_weight", lambda n, i: _fill(_layers(n)[i].input_layernorm.weight, 1.0), "post_attention",
        ("llama", "qwen2")),
    Bug("dropped_norm_weight_bert", lambda n, i: _fill(_layers(n)[i].attention.output.LayerNorm.weight, 1.0),
        "post_attention", ("bert",)),
    Bug("dropped_bias", lambda n, i: _fill(_layers(n)[i].self_attn.v_proj.bias, 0.0), "post_attention", ("qwen2",)),
    # the norm in front of the MLP belongs to the MLP block: only the MLP is marked (within bfloat16's
    # noise on these models: float32 only)
    Bug("dropped_mlp_norm_weight", lambda n, i: _fill(_layers(n)[i].post_attention_layernorm.weight, 1.0), "post_mlp",
        ("llama", "qwen2"), ("float32",)),
    Bug("dropped_bias_bert", lambda n, i: _fill(_layers(n)[i].output.dense.bias, 0.0), "post_mlp", ("bert",)),
    # a bfloat16 model's own softmax precision is what the trusted bfloat16 run does: float32 only
    Bug("reduced_precision_softmax", lambda n, i: _use_attention(n, i, "df_bug_softmax", softmax_dtype=torch.bfloat16),
        "post_attention", ("llama", "qwen2", "bert"), ("float32",)),
    Bug("causal_mask_off_by_one", lambda n, i: _use_attention(n, i, "df_bug_causal", mask_fn=_future_token),
        "post_attention", ("llama", "qwen2")),
    # one real token of the padded row lost: its effect is within bfloat16's noise on these models
    Bug("padding_mask_off_by_one", lambda n, i: _use_attention(n, i, "df_bug_pad1", mask_fn=_padding_off_by_one),
        "post_attention", ("bert",), ("float32",)),
    Bug("kv_head_mapping", lambda n, i: _use_attention(n, i, "df_bug_kv", tile_kv=True), "post_attention",
        ("llama", "qwen2")),
    Bug("rope_convention", _rope_interleaved, "post_attention", ("llama", "qwen2")),
    # tanh-approximate GELU differs from erf GELU by < 1e-3: beyond float32 noise, within bfloat16's
    Bug("gelu_variant", _gelu_tanh, "post_mlp", ("bert",), ("float32",)),
    Bug("ignored_padding_mask", lambda n, i: _use_attention(n, i, "df_bug_nopad", mask_fn=lambda m: None),
        "post_attention", ("bert",)),
)}


#: the families of the original suite (Llama, Qwen2, BERT); the others' bugs run in bench_diagnosis
#: and, one per family, in tests/judgement/test_decoder_family_bugs.py.
CORE_FAMILIES = ("llama", "qwen2", "bert")


def cases(families: tuple[str, ...] | None = None) -> list[tuple[str, str, str]]:
    """Every (bug, family, dtype) of ``families`` (all when None)."""
    return [(b.name, fam, dt) for b in BUGS.values() for fam in b.families for dt in b.dtypes
            if families is None or fam in families]


def expected_first(bug: str) -> CheckpointKey:
    return CheckpointKey(BUGS[bug].first, BUG_LAYER)


def register_bug_backend(bug: str | None) -> str:
    """Register ``hf_bug_<bug>`` (``hf_correct`` for None): eager transformers with the bug in layer BUG_LAYER."""
    name = f"hf_bug_{bug}" if bug else "hf_correct"

    def build(model: Any, dtype: torch.dtype, device: str) -> torch.nn.Module:
        net = build_hf_model(model, dtype, device)
        if bug is not None:
            BUGS[bug].patch(net, BUG_LAYER)
        return net

    register_backend(name, module_backend(name, build), replace=True)
    return name
