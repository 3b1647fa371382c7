"""Typed model configurations read from a Hugging Face ``config.json``.

Two families are supported: the Llama family (``llama``, ``qwen2`` decoders:
RMSNorm, rotary embeddings, grouped-query attention, SiLU-gated MLP) and the BERT family
(``bert``: post-LN encoder). Anything else is an unsupported architecture (DF004).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..errors import ModelLoadingError
from .fields import MAX_LAYERS, MAX_POSITIONS, ConfigReader
from .files import read_json, short_repr

__all__ = [
    "LLAMA_MODEL_TYPES",
    "BERT_MODEL_TYPES",
    "RopeScaling",
    "LlamaModelConfig",
    "BertModelConfig",
    "ModelConfig",
    "parse_config",
    "read_config_file",
    "UnsupportedByReference",
]

LLAMA_MODEL_TYPES = frozenset({"llama", "qwen2"})  # mistral needs sliding-window attention: not yet
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


ModelConfig = LlamaModelConfig | BertModelConfig


class UnsupportedByReference(ModelLoadingError):
    """DF004 for a config no reference written from the math implements (its architecture, or a
    feature of it); the loader runs such a model on the generic tier instead (``modelio.generic``)."""


def read_config_file(path: Path) -> dict[str, Any]:
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


def _sizes(r: ConfigReader, model_type: str) -> dict[str, Any]:
    """The sizes every family reads the same way from ``config.json``."""
    return {"model_type": model_type, "vocab_size": r.integer("vocab_size"),
            "hidden_size": r.integer("hidden_size"), "intermediate_size": r.integer("intermediate_size"),
            "num_hidden_layers": r.integer("num_hidden_layers", hi=MAX_LAYERS),
            "num_attention_heads": r.integer("num_attention_heads")}


def _unsupported(what: str, source: str, hint: str | None = None) -> ModelLoadingError:
    """DF004 for a config the reference would compute differently from transformers."""
    return UnsupportedByReference(f"{what} is not supported: the reference model does not implement it",
                             hint=hint or "use a config without it, or compare without the reference", file=source)


def _rope_source(r: ConfigReader) -> tuple[str, dict[str, Any]]:
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
    p = ConfigReader(params, r.source, prefix=name + ".")
    theta = p.number("rope_theta", None, open_lo=True)
    if theta is None:
        theta = r.number("rope_theta", 10000.0, open_lo=True)
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
    kw: dict[str, Any] = {"rope_type": rope_type, "factor": p.number("factor", open_lo=True)}
    if rope_type == "llama3":
        kw["low_freq_factor"] = p.number("low_freq_factor", open_lo=True)
        kw["high_freq_factor"] = p.number("high_freq_factor", open_lo=True)
        if kw["high_freq_factor"] <= kw["low_freq_factor"]:
            raise _unsupported("llama3 rope scaling with high_freq_factor <= low_freq_factor", r.source)
        kw["original_max_position_embeddings"] = p.integer("original_max_position_embeddings", max_positions,
                                                           hi=MAX_POSITIONS)
    return theta, RopeScaling(**kw)


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


#: transformers' default ``max_position_embeddings`` per model type (llama3 rope scaling falls back on it).
_DEFAULT_POSITIONS = {"llama": 2048, "qwen2": 32768}


def _llama(r: ConfigReader, model_type: str) -> LlamaModelConfig:
    sizes = _sizes(r, model_type)
    heads, hidden = sizes["num_attention_heads"], sizes["hidden_size"]
    kv = r.integer("num_key_value_heads", heads, hi=heads, nullable=True)
    if heads % kv:
        raise ModelLoadingError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}", file=r.source
        )
    head_dim = r.integer("head_dim", hidden // heads, nullable=model_type == "llama")
    if head_dim < 1 or head_dim % 2:
        raise ModelLoadingError(f"head_dim={head_dim} must be positive and even (rotary embeddings rotate pairs)",
                                file=r.source)
    act = r.text("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadingError(f"hidden_act {act!r} is not supported for {model_type}", file=r.source)
    qwen = model_type == "qwen2"
    if qwen:
        _check_qwen2_attention(r, sizes["num_hidden_layers"])
    max_positions = r.integer("max_position_embeddings", _DEFAULT_POSITIONS[model_type], hi=MAX_POSITIONS)
    theta, scaling = _rope(r, max_positions)
    attention_bias = r.flag("attention_bias")
    _pad_token_id(r, sizes["vocab_size"], None)
    return LlamaModelConfig(
        **sizes,
        num_key_value_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=r.number("rms_norm_eps", 1e-6, float_only=True),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_positions,
        tie_word_embeddings=r.flag("tie_word_embeddings"),
        qkv_bias=qwen or attention_bias,
        o_bias=attention_bias and not qwen,
        mlp_bias=r.flag("mlp_bias") and not qwen,  # transformers' Qwen2 MLP has no bias, whatever the config says
        hidden_act=act,
    )


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


def parse_config(data: dict[str, Any], source: str = "config.json") -> ModelConfig:
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
        return _llama(r, model_type)
    if model_type in BERT_MODEL_TYPES:
        return _bert(r, model_type)
    raise UnsupportedByReference(
        f"unsupported architecture: model_type {short_repr(data.get('model_type', ''))}",
        hint="supported model types: " + ", ".join(sorted(LLAMA_MODEL_TYPES | BERT_MODEL_TYPES)),
        file=source,
    )
