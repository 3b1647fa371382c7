"""Typed model configurations read from a Hugging Face ``config.json``.

Two families are supported: the Llama family (``llama``, ``qwen2`` decoders:
RMSNorm, rotary embeddings, grouped-query attention, SiLU-gated MLP) and the BERT family
(``bert``: post-LN encoder). Anything else is an unsupported architecture (DF004).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..errors import ModelLoadingError

__all__ = [
    "LLAMA_MODEL_TYPES",
    "BERT_MODEL_TYPES",
    "RopeScaling",
    "LlamaModelConfig",
    "BertModelConfig",
    "ModelConfig",
    "parse_config",
    "read_config_file",
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


def read_config_file(path: Path) -> dict[str, Any]:
    """Read and JSON-parse ``config.json``; DF004 when missing or not JSON."""
    if not path.is_file():
        raise ModelLoadingError(
            "config.json not found beside the weights",
            hint="put the model's Hugging Face config.json next to the weights file",
            file=str(path),
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadingError(f"config.json is not valid JSON: {exc}", file=str(path)) from exc
    if not isinstance(data, dict):
        raise ModelLoadingError("config.json does not hold a JSON object", file=str(path))
    return data


def _sizes(data: dict[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """The fields every family reads the same way from ``config.json``."""
    return {"model_type": model_type, "vocab_size": _req(data, "vocab_size", int, source),
            "intermediate_size": _req(data, "intermediate_size", int, source),
            "num_hidden_layers": _req(data, "num_hidden_layers", int, source)}


def _req(data: dict[str, Any], key: str, kind: type, source: str) -> Any:
    if key not in data or data[key] is None:
        raise ModelLoadingError(f"config.json lacks the required key {key!r}", file=source)
    try:
        return kind(data[key])
    except (TypeError, ValueError) as exc:
        raise ModelLoadingError(f"config.json key {key!r} has a bad value {data[key]!r}", file=source) from exc


def _rope(data: dict[str, Any], source: str) -> tuple[float, RopeScaling]:
    # transformers 5 writes `rope_parameters` (with rope_theta inside); 4.x wrote rope_theta + rope_scaling.
    params = dict(data.get("rope_parameters") or {})
    scaling = dict(data.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", data.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise ModelLoadingError(
            f"rope scaling type {rope_type!r} is not supported",
            hint="supported rope types: default, linear, llama3",
            file=source,
        )
    if rope_type == "default":
        return theta, RopeScaling()
    if "factor" not in merged:
        raise ModelLoadingError(f"rope scaling {rope_type!r} lacks 'factor'", file=source)
    kw: dict[str, Any] = {"rope_type": rope_type, "factor": float(merged["factor"])}
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in merged:
                raise ModelLoadingError(f"llama3 rope scaling lacks {key!r}", file=source)
        kw["low_freq_factor"] = float(merged["low_freq_factor"])
        kw["high_freq_factor"] = float(merged["high_freq_factor"])
        kw["original_max_position_embeddings"] = int(merged["original_max_position_embeddings"])
    return theta, RopeScaling(**kw)


def parse_config(data: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """Build the typed config of a supported architecture; DF004 otherwise."""
    model_type = str(data.get("model_type", ""))
    if model_type in LLAMA_MODEL_TYPES:
        heads = _req(data, "num_attention_heads", int, source)
        hidden = _req(data, "hidden_size", int, source)
        kv = int(data.get("num_key_value_heads") or heads)
        if heads % kv:
            raise ModelLoadingError(
                f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}", file=source
            )
        theta, scaling = _rope(data, source)
        attention_bias = bool(data.get("attention_bias", False))
        qwen = model_type == "qwen2"
        act = str(data.get("hidden_act", "silu"))
        if act != "silu":
            raise ModelLoadingError(f"hidden_act {act!r} is not supported for {model_type}", file=source)
        return LlamaModelConfig(
            **_sizes(data, model_type, source),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=int(data.get("head_dim") or hidden // heads),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            qkv_bias=qwen or attention_bias,
            o_bias=attention_bias and not qwen,
            mlp_bias=bool(data.get("mlp_bias", False)),
            hidden_act=act,
        )
    if model_type in BERT_MODEL_TYPES:
        act = str(data.get("hidden_act", "gelu"))
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise ModelLoadingError(f"hidden_act {act!r} is not supported for bert", file=source)
        pet = data.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise ModelLoadingError(f"position_embedding_type {pet!r} is not supported", file=source)
        if data.get("is_decoder"):
            raise ModelLoadingError("BERT as a decoder (is_decoder=true) is not supported", file=source)
        return BertModelConfig(
            **_sizes(data, model_type, source),
            hidden_size=_req(data, "hidden_size", int, source),
            num_attention_heads=_req(data, "num_attention_heads", int, source),
            max_position_embeddings=int(data.get("max_position_embeddings", 512)),
            type_vocab_size=int(data.get("type_vocab_size", 2)),
            layer_norm_eps=float(data.get("layer_norm_eps", 1e-12)),
            hidden_act=act,
            pad_token_id=int(data.get("pad_token_id") or 0),
        )
    raise ModelLoadingError(
        f"unsupported architecture: model_type {model_type!r}",
        hint="supported model types: " + ", ".join(sorted(LLAMA_MODEL_TYPES | BERT_MODEL_TYPES)),
        file=source,
    )
