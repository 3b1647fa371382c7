"""A GGUF file as a model: its metadata mapped to the typed config, its tensors (dequantized,
under Hugging Face's names, q/k rows back in Hugging Face's order) as the weights.

``load_model("model.gguf")`` reads it here (:func:`gguf_model_parts`): the reference written from the math then runs on the
file's own weights in float64. Families: those both llama.cpp and the references support
(:data:`GGUF_ARCHITECTURES`); an architecture without such a reference that the generic tier reads
(:data:`~.gguf_generic.GENERIC_GGUF_ARCHITECTURES`: GPT-2, StarCoder2, StableLM, Phi-2) becomes a
generic-tier model (:mod:`.gguf_generic`); another architecture is refused with DF004 naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelLoadingError
from ..jsonio import JsonObject
from .configs import LlamaModelConfig, parse_config
from .gguf_read import GgufFile, read_gguf

if TYPE_CHECKING:
    import torch

    from .generic import GenericModelConfig
    from .weights import TensorReader

__all__ = ["GGUF_ARCHITECTURES", "GgufReader", "gguf_config", "hf_name", "gguf_name", "GEMMA_ARCHS", "gguf_model_parts",
           "unpermute_for_rope"]

#: llama.cpp architecture -> Hugging Face ``model_type`` of the reference that runs it
GGUF_ARCHITECTURES: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                                      "gemma2": "gemma2", "gemma3": "gemma3_text"}

#: llama.cpp architectures whose q/k rows the converter permuted
_PERMUTED_ARCHS = frozenset({"llama"})

_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
#: Gemma's norms: one before and one after each block (llama.cpp's ``ffn_norm`` is the pre-MLP one)
_GEMMA_LAYER = {**_LAYER, "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
#: llama.cpp architectures whose norm weights the converter stores as ``1 + w`` (Hugging Face stores ``w``)
GEMMA_ARCHS = frozenset({"gemma2", "gemma3"})
#: the fused projections of an architecture that fuses them (Phi-3): llama.cpp name -> Hugging Face module
_FUSED = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
#: llama.cpp architectures with fused q/k/v and gate/up projections
_FUSED_ARCHS = frozenset({"phi3"})
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}


def _modules(architecture: str) -> dict[str, str]:
    """llama.cpp layer module -> Hugging Face module of an ``architecture`` file."""
    if architecture in _FUSED_ARCHS:
        return {**_LAYER, **_FUSED}
    return _GEMMA_LAYER if architecture in GEMMA_ARCHS else _LAYER


def hf_name(name: str, architecture: str = "llama") -> str | None:
    """The Hugging Face name of llama.cpp tensor ``name`` of an ``architecture`` file
    (``blk.0.attn_q.weight`` -> ``model.layers.0.self_attn.q_proj.weight``; Phi-3's ``blk.0.ffn_up``
    -> ``mlp.gate_up_proj``), None for one the references do not read."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".")
    modules = _modules(architecture)
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in modules:
        return None
    return f"model.layers.{int(parts[1])}.{modules[parts[2]]}.{parts[3]}"


def gguf_name(name: str, architecture: str = "llama") -> str | None:
    """The llama.cpp name of Hugging Face tensor ``name`` in an ``architecture`` file (the inverse
    of :func:`hf_name`)."""
    for g, h in _GLOBAL.items():
        if h == name:
            return g
    parts = name.split(".")
    inverse = {v: k for k, v in _modules(architecture).items()}
    if architecture not in _FUSED_ARCHS:
        inverse.update({v: k for k, v in _FUSED.items()})
    if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return None
    module = ".".join(parts[3:-1])
    return f"blk.{int(parts[2])}.{inverse[module]}.{parts[-1]}" if module in inverse else None


def unpermute_for_rope(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """The inverse of the writer's ``permute_for_rope``: llama.cpp's interleaved q/k rows back
    in Hugging Face's half-split order."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _int(f: GgufFile, key: str, default: int | None = None) -> int:
    value = f.key(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadingError(f"GGUF key {f.architecture}.{key} must be a positive integer, got {value!r}",
                                file=str(f.path))
    return value


def _float(f: GgufFile, key: str, default: float) -> float:
    value = f.key(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelLoadingError(f"GGUF key {f.architecture}.{key} must be a number, got {value!r}", file=str(f.path))
    return float(value)


def gguf_config(f: GgufFile) -> JsonObject:
    """The file's metadata as a Hugging Face ``config.json`` of its family (read by ``parse_config``)."""
    arch = f.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadingError(
            f"GGUF architecture {arch!r} has no reference here", file=str(f.path),
            hint="supported GGUF architectures: " + ", ".join([*GGUF_ARCHITECTURES, *_generic_architectures()])
                 + "; validate the Hugging Face model it was converted from instead")
    if "token_embd.weight" not in f.tensors:
        raise ModelLoadingError("the GGUF has no token_embd.weight", file=str(f.path))
    vocab, hidden = f.tensors["token_embd.weight"].shape
    heads = _int(f, "attention.head_count")
    config: JsonObject = {
        "model_type": GGUF_ARCHITECTURES[arch], "vocab_size": vocab, "hidden_size": _int(f, "embedding_length"),
        "intermediate_size": _int(f, "feed_forward_length"), "num_hidden_layers": _int(f, "block_count"),
        "num_attention_heads": heads, "num_key_value_heads": _int(f, "attention.head_count_kv", heads),
        "head_dim": _int(f, "attention.key_length", hidden // heads),
        "rms_norm_eps": _float(f, "attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": _float(f, "rope.freq_base", 10000.0),
        "max_position_embeddings": _int(f, "context_length", 2048),
        "tie_word_embeddings": "output.weight" not in f.tensors, "hidden_act": "silu",
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in f.tensors
    if arch in GEMMA_ARCHS:
        config.update(_gemma_config(f, config))
    if f.key("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": _float(f, "rope.scaling.factor", 1.0)}
    elif f.key("rope.scaling.type") not in (None, "none"):
        raise ModelLoadingError(f"GGUF rope scaling {f.key('rope.scaling.type')!r} is not read here",
                                file=str(f.path), hint="validate a file without rope scaling, or with linear scaling")
    return config


def _generic_architectures() -> list[str]:
    """The architectures the generic tier reads (:mod:`.gguf_generic`)."""
    from .gguf_generic import GENERIC_GGUF_ARCHITECTURES

    return list(GENERIC_GGUF_ARCHITECTURES)


def _gemma_config(f: GgufFile, config: JsonObject) -> JsonObject:
    """Gemma's keys: llama.cpp scales queries by ``head_dim ** -0.5`` (its ``query_pre_attn_scalar``),
    soft-caps (Gemma 2), the sliding window (every other layer in Gemma 2, five of six in Gemma 3,
    as llama.cpp lays them out), Gemma 3's local rope base."""
    window = _int(f, "attention.sliding_window")
    extra: JsonObject = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
                         "query_pre_attn_scalar": config["head_dim"], "sliding_window": window}
    if f.architecture == "gemma2":
        extra["attn_logit_softcapping"] = _float(f, "attn_logit_softcapping", 50.0)
        extra["final_logit_softcapping"] = _float(f, "final_logit_softcapping", 30.0)
    else:
        extra["rope_local_base_freq"] = _float(f, "rope.freq_base_swa", 10000.0)
        if f.key("final_logit_softcapping") is not None:
            extra["final_logit_softcapping"] = _float(f, "final_logit_softcapping", 0.0)
    return extra


class GgufReader:
    """The tensors of a GGUF file under Hugging Face's names (a ``TensorReader``): dequantized to
    float32 on demand, q/k rows of a permuting architecture put back in Hugging Face's order."""

    def __init__(self, path: Path, header: GgufFile | None = None) -> None:
        self.path = Path(path)
        self.file = header if header is not None else read_gguf(self.path)
        self._names = {h: g for g in self.file.tensors if (h := hf_name(g, self.file.architecture)) is not None}
        self._heads = (self.file.key("attention.head_count"), self.file.key("attention.head_count_kv"))

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.file.tensors[self._names[name]].shape

    def dtype(self, name: str) -> str:
        return "F32"  # what tensor() returns; the stored type is GgufFile.tensor_types()

    def stored_type(self, name: str) -> str:
        """The GGML type the file stores ``name`` in (``Q8_0``)."""
        return self.file.tensors[self._names[name]].type_name

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 NumPy, in Hugging Face's layout."""
        stored = self._names[name]
        data = self.file.read(stored)
        if self.file.architecture in _PERMUTED_ARCHS and ".attn_q." in stored:
            data = unpermute_for_rope(data, int(self._heads[0]), int(self._heads[0]))  # type: ignore[arg-type]
        elif self.file.architecture in _PERMUTED_ARCHS and ".attn_k." in stored:
            data = unpermute_for_rope(data, int(self._heads[0]), int(self._heads[1] or self._heads[0]))  # type: ignore[arg-type]
        elif self.file.architecture in GEMMA_ARCHS and stored.endswith("norm.weight"):
            data = data - np.float32(1.0)  # stored as 1 + w, as llama.cpp multiplies by it
        return np.ascontiguousarray(data)

    def tensor(self, name: str) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.array(name))


def gguf_model_parts(path: Path) -> tuple[LlamaModelConfig | GenericModelConfig, JsonObject,
                                          dict[str, tuple[TensorReader, str]], dict[str, tuple[int, ...]] | None]:
    """A GGUF file's typed config, its metadata as a ``config.json``, where each tensor is (what
    ``load_model`` checks and wraps as a ``LoadedModel`` of format ``"gguf"``), and, for an
    architecture the generic tier runs (:mod:`.gguf_generic`), the tensors its ``transformers``
    model reads (None for a family with a reference written from the math: its own layout).

    Raises:
        ModelLoadingError: (DF004) a malformed file (:func:`~.gguf_read.read_gguf`, always checked
            first), an architecture neither a reference nor the generic tier reads, metadata of
            the wrong type.
    """
    from .gguf_generic import GENERIC_GGUF_ARCHITECTURES, generic_gguf_parts

    header = read_gguf(path)
    if header.architecture in GENERIC_GGUF_ARCHITECTURES:
        return generic_gguf_parts(header)
    raw = gguf_config(header)
    config = parse_config(raw, source=str(path))
    assert isinstance(config, LlamaModelConfig)
    reader = GgufReader(path, header)
    return config, raw, {name: (reader, name) for name in reader.names()}, None
