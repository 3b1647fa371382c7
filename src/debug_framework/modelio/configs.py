"""Typed model configurations read from a Hugging Face ``config.json``.

Three layer structures are supported: the Llama family of pre-norm rotary decoders (``llama``,
``qwen2``, ``mistral`` with its sliding window, ``qwen3`` with q/k norms, ``phi3`` with fused
projections, and the mixture-of-experts ``qwen3_moe``: :class:`LlamaModelConfig` and
:class:`MoeModelConfig`), the Gemma decoders with norms before and after each block (``gemma2``,
``gemma3_text``: :class:`GemmaModelConfig`), and the BERT family (``bert``: post-LN encoder).
Anything else is an unsupported architecture (DF004).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from ..errors import ModelLoadingError
from ..jsonio import JsonObject
from .fields import MAX_LAYERS, MAX_POSITIONS, ConfigReader
from .files import read_json, short_repr

__all__ = [
    "LLAMA_MODEL_TYPES",
    "BERT_MODEL_TYPES",
    "RopeScaling",
    "LlamaModelConfig",
    "GemmaModelConfig",
    "MoeModelConfig",
    "BertModelConfig",
    "ModelConfig",
    "parse_config",
    "read_config_file",
    "UnsupportedByReference",
]

LLAMA_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral", "qwen3", "phi3", "qwen3_moe", "gemma2", "gemma3_text"})
BERT_MODEL_TYPES = frozenset({"bert"})


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: ``default``, ``linear`` (positions divided by ``factor``) or ``llama3``."""

    rope_type: Literal["default", "linear", "llama3"] = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class _TransformerConfig:
    """What every supported family's config declares."""

    #: the family (``"llama"`` or ``"bert"``): which reference model and checkpoint map apply
    architecture: ClassVar[str]
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers


@dataclass(frozen=True)
class LlamaModelConfig(_TransformerConfig):
    """A decoder of the Llama family (Llama, Qwen2-style q/k/v bias)."""

    architecture: ClassVar[str] = "llama"
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    #: bias on the q, k and v projections (Qwen2, or Llama with ``attention_bias``).
    qkv_bias: bool
    #: bias on the output projection (Llama with ``attention_bias``).
    o_bias: bool
    mlp_bias: bool
    hidden_act: str = "silu"
    #: per layer, ``"full_attention"`` or ``"sliding_attention"`` (empty: every layer attends fully).
    layer_types: tuple[str, ...] = ()
    #: a sliding-window layer's query at i sees keys j with ``i - sliding_window < j <= i``.
    sliding_window: int | None = None
    #: an RMS norm over each head's queries and keys before the rotation (Qwen3, Gemma 3).
    qk_norm: bool = False
    #: q, k, v in one ``qkv_proj`` and gate, up in one ``gate_up_proj`` (Phi-3).
    fused_projections: bool = False

    @property
    def attention_scale(self) -> float:
        """What ``q . k`` is multiplied by before the softmax: ``head_dim ** -0.5``."""
        return float(self.head_dim) ** -0.5

    def is_sliding(self, i: int) -> bool:
        """Whether layer ``i`` attends through the sliding window."""
        return self.sliding_window is not None and bool(self.layer_types) and self.layer_types[i] == "sliding_attention"


@dataclass(frozen=True)
class GemmaModelConfig(LlamaModelConfig):
    """A Gemma 2 / Gemma 3 text decoder: embeddings scaled by ``sqrt(hidden_size)``, ``(1 + w)``
    RMS norms before and after each block, ``query_pre_attn_scalar``, soft-capped logits,
    alternating local (sliding-window) and global layers; Gemma 3 adds q/k norms and its own rope
    base for the local layers."""

    architecture: ClassVar[str] = "gemma"
    query_pre_attn_scalar: float = 256.0
    #: ``cap * tanh(scores / cap)`` on the attention scores (None: no cap).
    attn_logit_softcapping: float | None = None
    #: ``cap * tanh(logits / cap)`` on the final logits (None: no cap).
    final_logit_softcapping: float | None = None
    #: the rotary base and scaling of the sliding-window layers (Gemma 3; Gemma 2 uses ``rope_theta``).
    local_rope_theta: float | None = None
    local_rope_scaling: RopeScaling = RopeScaling()

    @property
    def attention_scale(self) -> float:
        """``query_pre_attn_scalar ** -0.5``."""
        return self.query_pre_attn_scalar ** -0.5


@dataclass(frozen=True)
class MoeModelConfig(LlamaModelConfig):
    """A Llama-family decoder whose every MLP is a sparse mixture of experts (Qwen3-MoE): a linear
    router, softmax over the experts, the top ``num_experts_per_tok``, renormalised when
    ``norm_topk_prob``, each a SiLU-gated MLP of width ``moe_intermediate_size``."""

    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    norm_topk_prob: bool = False

    @property
    def router_layers(self) -> tuple[int, ...]:
        """Every layer routes its tokens: each one's ``router_logits`` is a checkpoint."""
        return tuple(range(self.num_hidden_layers))

    @property
    def experts_per_token(self) -> int:
        """The experts each token takes (the expert choice judged at ``router_logits``)."""
        return self.num_experts_per_tok


@dataclass(frozen=True)
class BertModelConfig(_TransformerConfig):
    """A BERT encoder."""

    architecture: ClassVar[str] = "bert"
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


ModelConfig = LlamaModelConfig | BertModelConfig  # GemmaModelConfig and MoeModelConfig are LlamaModelConfigs


class UnsupportedByReference(ModelLoadingError):
    """DF004 for a config no reference written from the math implements (its architecture, or a
    feature of it); the loader runs such a model on the generic tier instead (``modelio.generic``)."""


def read_config_file(path: Path) -> JsonObject:
    """Read and JSON-parse ``config.json`` (a regular file, bounded in size and depth); DF004 when
    missing, not a regular file or not a JSON object."""
    if not path.exists():
        raise ModelLoadingError(
            "config.json not found beside the weights",
            hint="put the model's Hugging Face config.json next to the weights file",
            file=str(path),
        )
    data = read_json(path, "config.json")
    if not isinstance(data, dict):
        raise ModelLoadingError("config.json does not hold a JSON object", file=str(path))
    return data


def _sizes(r: ConfigReader, model_type: str) -> dict[str, object]:
    """The sizes every family reads the same way from ``config.json``."""
    return {"model_type": model_type, "vocab_size": r.integer("vocab_size"),
            "hidden_size": r.integer("hidden_size"), "intermediate_size": r.integer("intermediate_size"),
            "num_hidden_layers": r.integer("num_hidden_layers", hi=MAX_LAYERS),
            "num_attention_heads": r.integer("num_attention_heads")}


def _unsupported(what: str, source: str, hint: str | None = None) -> ModelLoadingError:
    """DF004 for a config the reference would compute differently from transformers."""
    return UnsupportedByReference(f"{what} is not supported: the reference model does not implement it",
                             hint=hint or "use a config without it, or compare without the reference", file=source)


def _rope_source(r: ConfigReader) -> tuple[str, JsonObject]:
    """The rope parameters as transformers picks them: a non-empty ``rope_scaling`` (4.x) replaces
    ``rope_parameters`` (5.x) as a whole; named for messages."""
    scaling, params = r.mapping("rope_scaling"), r.mapping("rope_parameters")
    name, chosen = ("rope_scaling", scaling) if scaling else ("rope_parameters", params or {})
    if any(isinstance(v, dict) for v in chosen.values()):
        raise _unsupported(f"{name} with nested (per-layer) parameters", r.source)
    return name, chosen


def _rope(r: ConfigReader, max_positions: int) -> tuple[float, RopeScaling]:
    """rope_theta and the scaling, read with transformers' precedence: a key inside the rope
    parameters first, then the top-level key, then the default."""
    name, params = _rope_source(r)
    return _rope_in(r, name, params, r.number("rope_theta", 10000.0, open_lo=True), max_positions)


def _rope_in(r: ConfigReader, name: str, params: JsonObject, theta_default: float,
             max_positions: int) -> tuple[float, RopeScaling]:
    """rope_theta (``params``' own, else ``theta_default``) and the scaling of one rope parameter
    object ``params`` (named ``name`` in messages); a partial rotary factor other than 1 is refused."""
    p = ConfigReader(params, r.source, prefix=name + ".")
    theta = p.number("rope_theta", None, open_lo=True)
    if theta is None:
        theta = theta_default
    partial = p.number("partial_rotary_factor", None, open_lo=True)
    partial = r.number("partial_rotary_factor", 1.0, open_lo=True, nullable=True) if partial is None else partial
    if partial != 1.0:
        raise _unsupported(f"partial_rotary_factor={partial}", r.source)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise _unsupported(f"rope scaling type {short_repr(rope_type)}", r.source,
                           hint="supported rope types: default, linear, llama3")
    if rope_type == "default":
        return theta, RopeScaling()
    kw: dict[str, object] = {"rope_type": rope_type, "factor": p.number("factor", open_lo=True)}
    if rope_type == "llama3":
        kw["low_freq_factor"] = p.number("low_freq_factor", open_lo=True)
        kw["high_freq_factor"] = p.number("high_freq_factor", open_lo=True)
        if kw["high_freq_factor"] <= kw["low_freq_factor"]:
            raise _unsupported("llama3 rope scaling with high_freq_factor <= low_freq_factor", r.source)
        kw["original_max_position_embeddings"] = p.integer("original_max_position_embeddings", max_positions,
                                                           hi=MAX_POSITIONS)
    return theta, RopeScaling(**kw)


def _gemma3_rope(r: ConfigReader, max_positions: int) -> tuple[tuple[float, RopeScaling], tuple[float, RopeScaling]]:
    """Gemma 3's two ropes, (global, local), as transformers builds them: ``rope_parameters`` keyed
    by layer type, a legacy ``rope_scaling`` merged into the global one, ``rope_theta`` (10^6) and
    ``rope_local_base_freq`` (10^4) as the bases a parameter object does not give."""
    params = r.mapping("rope_parameters") or {}
    unknown = sorted(set(params) - {"full_attention", "sliding_attention"})
    if unknown:
        raise _unsupported(f"rope_parameters keys {unknown} (Gemma 3 keys its rope parameters by layer type)",
                           r.source)
    full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    for name, value in (("full_attention", full), ("sliding_attention", local)):
        if any(isinstance(v, dict) for v in value.values()):
            raise _unsupported(f"rope_parameters.{name} with nested parameters", r.source)
    full.update(r.mapping("rope_scaling") or {})
    return (_rope_in(r, "rope_parameters.full_attention", full,
                     r.number("rope_theta", 1_000_000.0, open_lo=True), max_positions),
            _rope_in(r, "rope_parameters.sliding_attention", local,
                     r.number("rope_local_base_freq", 10_000.0, open_lo=True), max_positions))


def _pad_token_id(r: ConfigReader, vocab: int, default: int | None) -> int:
    """``pad_token_id``: null or an index into the vocabulary (negative counts from the end, as in torch)."""
    pad = r.integer("pad_token_id", default, lo=-vocab, hi=vocab - 1, nullable=True)
    return 0 if pad is None else pad


def _check_qwen2_attention(r: ConfigReader, layers: int) -> None:
    """Qwen2's sliding-window layers (transformers' rule): the reference attends to every position."""
    types = r.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise r.error("layer_types", "must be a list of strings")
        other = sorted({t for t in types if t != "full_attention"})
        if other:
            raise _unsupported(f"layer_types {other}", r.source)
        return
    window = r.integer("sliding_window", None, nullable=True, hi=MAX_POSITIONS)
    if r.flag("use_sliding_window") and window is not None and layers > r.integer("max_window_layers", 28, lo=0):
        raise _unsupported("sliding-window attention (use_sliding_window=true)", r.source)


@dataclass(frozen=True)
class _Defaults:
    """transformers' defaults of one decoder model type, for keys its ``config.json`` leaves out."""

    max_positions: int
    kv_heads: int | None = None  # None: as many as query heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    tie: bool = False
    sliding_window: int | None = None
    act_key: str = "hidden_act"
    act: str = "silu"


_DECODERS: dict[str, _Defaults] = {
    "llama": _Defaults(2048), "qwen2": _Defaults(32768), "mistral": _Defaults(131072, 8, sliding_window=4096),
    "qwen3": _Defaults(32768, 32, 128, sliding_window=4096), "phi3": _Defaults(4096, rms_norm_eps=1e-5),
    "qwen3_moe": _Defaults(32768, 4, sliding_window=4096),
    "gemma2": _Defaults(8192, 4, 256, tie=True, sliding_window=4096, act_key="hidden_activation",
                        act="gelu_pytorch_tanh"),
    "gemma3_text": _Defaults(131072, 4, 256, tie=True, sliding_window=4096, act_key="hidden_activation",
                             act="gelu_pytorch_tanh"),
}
#: the MLP activations each decoder type may name (``gelu_pytorch_tanh`` and ``gelu_new`` are one function).
_ACTIVATIONS = {"gemma2": ("gelu_pytorch_tanh", "gelu_new", "gelu"), "gemma3_text": ("gelu_pytorch_tanh", "gelu_new", "gelu")}
_ATTENTION_TYPES = frozenset({"full_attention", "sliding_attention"})


def _layer_types(r: ConfigReader, model_type: str, layers: int) -> tuple[tuple[str, ...], int | None]:
    """Each layer's attention type and the sliding window, as each model type's transformers code
    decides them: Mistral, Phi-3 and Qwen3-MoE slide in every layer when ``sliding_window`` is set
    (Qwen3-MoE only with ``use_sliding_window``); Qwen3 slides from layer ``max_window_layers`` on,
    Gemma 2 in every other layer and Gemma 3 in five of six, unless ``layer_types`` says otherwise."""
    d = _DECODERS[model_type]
    window = r.integer("sliding_window", d.sliding_window, nullable=True, hi=MAX_POSITIONS)
    if model_type in ("qwen3", "qwen3_moe") and not r.flag("use_sliding_window"):
        window = None
    if model_type in ("mistral", "phi3", "qwen3_moe"):  # their attention reads config.sliding_window, not layer_types
        return (("sliding_attention" if window is not None else "full_attention"),) * layers, window
    types = r.data.get("layer_types")
    if types is None:
        if model_type == "qwen3":
            first = r.integer("max_window_layers", 28, lo=0)
            types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                     for i in range(layers)]
        else:
            every = 2 if model_type == "gemma2" else r.integer("sliding_window_pattern", 6)
            types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise r.error("layer_types", "must be a list of strings")
    other = sorted(set(types) - _ATTENTION_TYPES)
    if other:
        raise _unsupported(f"layer_types {other}", r.source, hint="supported: full_attention, sliding_attention")
    if len(types) != layers:
        raise r.error("layer_types", f"must name one attention type per layer ({layers})")
    if "sliding_attention" in types and window is None:
        raise _unsupported("sliding_attention layers without a sliding_window", r.source)
    return tuple(types), window


def _cap(r: ConfigReader, key: str, default: float | None) -> float | None:
    """A soft-cap (``null``: none)."""
    return r.number(key, default, open_lo=True, nullable=True) if key in r.data else default


def _decoder(r: ConfigReader, model_type: str) -> LlamaModelConfig:
    """A decoder of the Llama family or of Gemma's (see the module's docstring)."""
    d = _DECODERS[model_type]
    sizes = _sizes(r, model_type)
    heads, hidden, layers = sizes["num_attention_heads"], sizes["hidden_size"], sizes["num_hidden_layers"]
    kv = r.integer("num_key_value_heads", heads if d.kv_heads is None else d.kv_heads, hi=heads, nullable=True)
    kv = heads if kv is None else kv
    if heads % kv:
        raise ModelLoadingError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}", file=r.source
        )
    head_dim = r.integer("head_dim", hidden // heads if d.head_dim is None else d.head_dim,
                         nullable=model_type in ("llama", "mistral"))
    if head_dim < 1 or head_dim % 2:
        raise ModelLoadingError(f"head_dim={head_dim} must be positive and even (rotary embeddings rotate pairs)",
                                file=r.source)
    act = r.text(d.act_key, d.act)
    if act not in _ACTIVATIONS.get(model_type, ("silu",)):
        raise _unsupported(f"{d.act_key} {act!r} for {model_type}", r.source,
                           hint="supported: " + ", ".join(_ACTIVATIONS.get(model_type, ("silu",))))
    qwen2 = model_type == "qwen2"
    if qwen2:
        _check_qwen2_attention(r, layers)
        types, window = (), None
    elif model_type == "llama":
        types, window = (), None
    else:
        types, window = _layer_types(r, model_type, layers)
    max_positions = r.integer("max_position_embeddings", d.max_positions, hi=MAX_POSITIONS)
    gemma3 = model_type == "gemma3_text"
    if gemma3:
        (theta, scaling), local_rope = _gemma3_rope(r, max_positions)
    else:
        theta, scaling = _rope(r, max_positions)
    attention_bias = r.flag("attention_bias") and model_type != "phi3"  # Phi-3's qkv_proj has no bias
    _pad_token_id(r, sizes["vocab_size"], None)
    common = dict(
        **sizes, num_key_value_heads=kv, head_dim=head_dim,
        rms_norm_eps=r.number("rms_norm_eps", d.rms_norm_eps, float_only=True),
        rope_theta=theta, rope_scaling=scaling, max_position_embeddings=max_positions,
        tie_word_embeddings=r.flag("tie_word_embeddings", d.tie),
        qkv_bias=qwen2 or attention_bias, o_bias=attention_bias and not qwen2,
        # transformers' Qwen2 MLP has no bias, whatever the config says; only Llama reads mlp_bias
        mlp_bias=r.flag("mlp_bias") and model_type == "llama",
        hidden_act=act, layer_types=types, sliding_window=window,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"), fused_projections=model_type == "phi3",
    )
    if model_type in ("gemma2", "gemma3_text"):
        if r.data.get("use_bidirectional_attention") not in (None, False):
            raise _unsupported("use_bidirectional_attention=true", r.source)
        attn_cap = _cap(r, "attn_logit_softcapping", 50.0 if model_type == "gemma2" else None)
        if gemma3 and attn_cap is not None:
            raise _unsupported(f"attn_logit_softcapping={attn_cap} on Gemma 3", r.source,
                               hint="transformers' Gemma 3 attention ignores it: remove it from config.json")
        return GemmaModelConfig(
            **common, query_pre_attn_scalar=r.number("query_pre_attn_scalar", 256.0, open_lo=True),
            attn_logit_softcapping=attn_cap,
            final_logit_softcapping=_cap(r, "final_logit_softcapping", 30.0 if model_type == "gemma2" else None),
            local_rope_theta=local_rope[0] if gemma3 else None,
            local_rope_scaling=local_rope[1] if gemma3 else RopeScaling(),
        )
    if model_type == "qwen3_moe":
        return _moe(r, common)
    return LlamaModelConfig(**common)


def _moe(r: ConfigReader, common: dict[str, object]) -> MoeModelConfig:
    """Qwen3-MoE's experts: every layer sparse (a dense layer among them is refused)."""
    experts = r.integer("num_local_experts", None) if "num_local_experts" in r.data else r.integer("num_experts", 128)
    top_k = r.integer("num_experts_per_tok", 8, hi=experts)
    if r.integer("decoder_sparse_step", 1) != 1:
        raise _unsupported("decoder_sparse_step other than 1 (dense MLP layers between the sparse ones)", r.source)
    if r.data.get("mlp_only_layers") not in (None, []):
        raise _unsupported("mlp_only_layers (dense MLP layers among the sparse ones)", r.source)
    return MoeModelConfig(**common, num_experts=experts, num_experts_per_tok=top_k,
                          moe_intermediate_size=r.integer("moe_intermediate_size", 768),
                          norm_topk_prob=r.flag("norm_topk_prob"))


def _bert(r: ConfigReader, model_type: str) -> BertModelConfig:
    act = r.text("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise ModelLoadingError(f"hidden_act {act!r} is not supported for bert", file=r.source)
    pet = r.data.get("position_embedding_type", "absolute")
    if pet not in (None, "absolute"):
        raise _unsupported(f"position_embedding_type {short_repr(pet)}", r.source)
    if r.flag("is_decoder"):
        raise _unsupported("BERT as a decoder (is_decoder=true)", r.source)
    r.flag("tie_word_embeddings")  # read by transformers for every model (BERT has no LM head to tie)
    if r.mapping("rope_scaling") or r.mapping("rope_parameters"):  # transformers validates them even for BERT
        raise _unsupported("rope scaling on a BERT config (BERT has absolute positions)", r.source)
    sizes = _sizes(r, model_type)
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if hidden % heads:
        raise ModelLoadingError(
            f"num_attention_heads={heads} does not divide hidden_size={hidden}", file=r.source,
            hint="BERT splits the hidden size evenly between its heads: check config.json",
        )
    return BertModelConfig(
        **sizes,
        max_position_embeddings=r.integer("max_position_embeddings", 512, hi=MAX_POSITIONS),
        type_vocab_size=r.integer("type_vocab_size", 2),
        layer_norm_eps=r.number("layer_norm_eps", 1e-12, float_only=True),
        hidden_act=act,
        pad_token_id=_pad_token_id(r, sizes["vocab_size"], 0),
    )


def parse_config(data: JsonObject, source: str = "config.json") -> ModelConfig:
    """Build the typed config of a supported architecture; DF004 otherwise.

    Every key is read with its JSON type and bounds (:class:`~.fields.ConfigReader`), and as
    transformers reads it: a config whose meaning the reference does not implement (another rope
    type, a partial rotary factor, sliding-window layers, relative positions) is refused.
    """
    if not isinstance(data, dict):
        raise ModelLoadingError("config.json does not hold a JSON object", file=source)
    model_type = data.get("model_type", "")
    model_type = model_type if isinstance(model_type, str) else ""
    r = ConfigReader(data, source)
    if model_type in LLAMA_MODEL_TYPES:
        return _decoder(r, model_type)
    if model_type in BERT_MODEL_TYPES:
        return _bert(r, model_type)
    raise UnsupportedByReference(
        f"unsupported architecture: model_type {short_repr(data.get('model_type', ''))}",
        hint="supported model types: " + ", ".join(sorted(LLAMA_MODEL_TYPES | BERT_MODEL_TYPES)),
        file=source,
    )
