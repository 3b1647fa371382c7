"""A GGUF file as a model: its metadata mapped to the typed config, its tensors (dequantized,
under Hugging Face's names, q/k rows back in Hugging Face's order, a mixture of experts' stacked
``ffn_*_exps`` tensors one expert at a time) as the weights.

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
           "unpermute_for_rope", "MOE_ARCHS", "EXPERT_TENSORS", "ROUTER_MODULE", "expert_of"]

#: llama.cpp architecture -> Hugging Face ``model_type`` of the reference that runs it
GGUF_ARCHITECTURES: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                                      "gemma2": "gemma2", "gemma3": "gemma3_text", "qwen3moe": "qwen3_moe"}

#: llama.cpp architectures whose every MLP is a mixture of experts -> whether llama.cpp's graph
#: renormalises the chosen experts' weights to sum to one (``qwen3moe``: always, whatever the
#: Hugging Face config's ``norm_topk_prob``). A second family of the same layout is one entry here.
MOE_ARCHS: dict[str, bool] = {"qwen3moe": True}

#: a mixture of experts' stacked tensors (``[experts, out, in]`` in Hugging Face's order): llama.cpp
#: name -> the projection of each expert ``mlp.experts.{e}.{projection}``
EXPERT_TENSORS: dict[str, str] = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
#: the router (``ffn_gate_inp``, ``[experts, hidden]``) as Hugging Face names its module
ROUTER_MODULE = "mlp.gate"

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
_MOE_LAYER = {k: v for k, v in _LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))} | {
    "ffn_gate_inp": ROUTER_MODULE}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}


def _modules(architecture: str) -> dict[str, str]:
    """llama.cpp layer module -> Hugging Face module of an ``architecture`` file."""
    if architecture in _FUSED_ARCHS:
        return {**_LAYER, **_FUSED}
    if architecture in MOE_ARCHS:
        return _MOE_LAYER
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
    expert = expert_of(name)
    if expert is not None:
        return expert[0]
    parts = name.split(".")
    inverse = {v: k for k, v in _modules(architecture).items()}
    if architecture not in _FUSED_ARCHS:
        inverse.update({v: k for k, v in _FUSED.items()})
    inverse.setdefault(ROUTER_MODULE, "ffn_gate_inp")
    if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return None
    module = ".".join(parts[3:-1])
    return f"blk.{int(parts[2])}.{inverse[module]}.{parts[-1]}" if module in inverse else None


def expert_of(name: str) -> tuple[str, int] | None:
    """The stacked llama.cpp tensor holding Hugging Face expert weight ``name``, and the expert's
    index in it (``model.layers.1.mlp.experts.2.down_proj.weight`` -> ``("blk.1.ffn_down_exps.weight",
    2)``); None for any other name."""
    parts = name.split(".")
    if (len(parts) != 8 or parts[:2] != ["model", "layers"] or parts[3:5] != ["mlp", "experts"]
            or not parts[2].isdigit() or not parts[5].isdigit() or parts[7] != "weight"):
        return None
    stacked = {v: k for k, v in EXPERT_TENSORS.items()}.get(parts[6])
    return None if stacked is None else (f"blk.{int(parts[2])}.{stacked}.weight", int(parts[5]))


def _expert_names(stored: str, shape: tuple[int, ...]) -> list[str]:
    """The Hugging Face names of the experts a stacked tensor ``blk.i.ffn_*_exps.weight`` of ``shape``
    ``[experts, out, in]`` holds, expert 0 first; none for any other tensor."""
    parts = stored.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in EXPERT_TENSORS \
            or len(shape) != 3:
        return []
    return [f"model.layers.{int(parts[1])}.mlp.experts.{e}.{EXPERT_TENSORS[parts[2]]}.weight" for e in range(shape[0])]


def unpermute_for_rope(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """The inverse of the writer's ``permute_for_rope``: llama.cpp's interleaved q/k rows back
    in Hugging Face's half-split order."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


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
    heads = f.positive_int("attention.head_count")
    config: JsonObject = {
        "model_type": GGUF_ARCHITECTURES[arch], "vocab_size": vocab, "hidden_size": f.positive_int("embedding_length"),
        "intermediate_size": f.positive_int("feed_forward_length", _experts_width(f)),
        "num_hidden_layers": f.positive_int("block_count"),
        "num_attention_heads": heads, "num_key_value_heads": f.positive_int("attention.head_count_kv", heads),
        "head_dim": f.positive_int("attention.key_length", hidden // heads),
        "rms_norm_eps": f.number("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": f.number("rope.freq_base", 10000.0),
        "max_position_embeddings": f.positive_int("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in f.tensors, "hidden_act": "silu",
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in f.tensors
    if arch in GEMMA_ARCHS:
        config.update(_gemma_config(f, config))
    if arch in MOE_ARCHS:
        config.update(_moe_config(f, config))
    if f.key("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": f.number("rope.scaling.factor", 1.0)}
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
    window = f.positive_int("attention.sliding_window")
    extra: JsonObject = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
                         "query_pre_attn_scalar": config["head_dim"], "sliding_window": window}
    if f.architecture == "gemma2":
        extra["attn_logit_softcapping"] = f.number("attn_logit_softcapping", 50.0)
        extra["final_logit_softcapping"] = f.number("final_logit_softcapping", 30.0)
    else:
        extra["rope_local_base_freq"] = f.number("rope.freq_base_swa", 10000.0)
        if f.key("final_logit_softcapping") is not None:
            extra["final_logit_softcapping"] = f.number("final_logit_softcapping", 0.0)
    return extra


def _experts_width(f: GgufFile) -> int | None:
    """A mixture of experts' ``feed_forward_length`` where the file has none (no dense MLP reads
    it): its experts' width; None for another architecture."""
    width = f.key("expert_feed_forward_length") if f.architecture in MOE_ARCHS else None
    return width if isinstance(width, int) else None


def _moe_config(f: GgufFile, config: JsonObject) -> JsonObject:
    """A mixture of experts' keys (``expert_count``, ``expert_used_count``,
    ``expert_feed_forward_length``), the renormalisation llama.cpp's graph applies
    (:data:`MOE_ARCHS`), and every layer's router and stacked expert tensors checked against them
    (DF004 naming the tensor: a file whose keys and tensors disagree)."""
    experts, used, width = (f.positive_int(key)
                            for key in ("expert_count", "expert_used_count", "expert_feed_forward_length"))
    if used > experts:
        raise ModelLoadingError(f"GGUF key {f.architecture}.expert_used_count {used} exceeds expert_count {experts}",
                                file=str(f.path), hint="the file's expert keys are wrong: convert the model again")
    hidden = int(config["hidden_size"])  # type: ignore[arg-type]
    expected = {"ffn_gate_inp": (experts, hidden), "ffn_gate_exps": (experts, width, hidden),
                "ffn_up_exps": (experts, width, hidden), "ffn_down_exps": (experts, hidden, width)}
    for i in range(int(config["num_hidden_layers"])):  # type: ignore[arg-type]
        for tensor, shape in expected.items():
            name = f"blk.{i}.{tensor}.weight"
            info = f.tensors.get(name)
            if info is None:
                raise ModelLoadingError(f"the GGUF has no {name} (layer {i}'s mixture of experts)", file=str(f.path),
                                        hint="convert the model again with llama.cpp's convert_hf_to_gguf.py")
            if tuple(info.shape) != shape:
                raise ModelLoadingError(
                    f"GGUF tensor {name} has shape {list(info.shape)} where expert_count {experts}, "
                    f"expert_feed_forward_length {width} and embedding_length {hidden} make {list(shape)}",
                    file=str(f.path), hint="the file's expert keys and tensors disagree: convert the model again")
    return {"num_experts": experts, "num_experts_per_tok": used, "moe_intermediate_size": width,
            "norm_topk_prob": MOE_ARCHS[f.architecture]}


class GgufReader:
    """The tensors of a GGUF file under Hugging Face's names (a ``TensorReader``): dequantized to
    float32 on demand, q/k rows of a permuting architecture put back in Hugging Face's order."""

    def __init__(self, path: Path, header: GgufFile | None = None) -> None:
        self.path = Path(path)
        self.file = header if header is not None else read_gguf(self.path)
        self._names = {h: g for g in self.file.tensors if (h := hf_name(g, self.file.architecture)) is not None}
        #: a mixture of experts' Hugging Face expert names -> (stacked tensor, expert index)
        self._experts: dict[str, tuple[str, int]] = {}
        if self.file.architecture in MOE_ARCHS:
            for stored, info in self.file.tensors.items():
                for e, name in enumerate(_expert_names(stored, info.shape)):
                    self._experts[name] = (stored, e)
                    self._names[name] = stored
        self._heads = (self.file.key("attention.head_count"), self.file.key("attention.head_count_kv"))

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self.file.tensors[self._names[name]].shape
        return shape[1:] if name in self._experts else shape

    def dtype(self, name: str) -> str:
        return "F32"  # what tensor() returns; the stored type is GgufFile.tensor_types()

    def stored_type(self, name: str) -> str:
        """The GGML type the file stores ``name`` in (``Q8_0``)."""
        return self.file.tensors[self._names[name]].type_name

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 NumPy, in Hugging Face's layout."""
        stored = self._names[name]
        if name in self._experts:
            return np.ascontiguousarray(self.file.read(stored, self._experts[name][1]))  # that expert's bytes alone
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
