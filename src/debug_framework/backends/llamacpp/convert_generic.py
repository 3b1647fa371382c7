"""What a GGUF of an architecture the generic tier runs (GPT-2, StarCoder2, StableLM, Phi-2) holds,
the way llama.cpp's ``convert_hf_to_gguf.py`` writes it (:func:`~.convert.write_gguf` writes it).

Tensor names come from the ``gguf`` package's table (``get_tensor_name_map``, the converter's
own) looked up on the ``transformers`` model; the layout changes the converter makes are
:func:`~debug_framework.modelio.gguf_generic.to_file_layout`'s (GPT-2's ``Conv1D`` weights
transposed), the keys are those llama.cpp reads for the architecture (``gguf.Keys`` through
``GGUFWriter``), and GPT-2's tied head is written as ``output.weight``, a copy of the embeddings,
as the converter writes it. What llama.cpp's graph for the architecture would compute differently
from the ``transformers`` model is refused with DF004 (a GPT-2 scaling attention by the inverse
layer index; an activation other than the graph's: the tanh GELU, StableLM's SiLU; StableLM's
per-head q/k LayerNorms; a rope scaling).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import ModelLoadingError
from ...jsonio import JsonObject
from ...modelio.generic import GenericModelConfig, build_skeleton
from ...modelio.gguf_generic import GENERIC_GGUF_ARCHITECTURES, gguf_names_of, to_file_layout
from ...modelio.loader import LoadedModel

__all__ = ["GENERIC_GGUF_FAMILIES", "generic_architecture", "generic_tensors", "add_generic_metadata"]

#: Hugging Face ``model_type`` -> llama.cpp architecture, for the generic tier's architectures
GENERIC_GGUF_FAMILIES: dict[str, str] = {a.model_type: name for name, a in GENERIC_GGUF_ARCHITECTURES.items()}

#: architectures whose converter writes a tied head as ``output.weight`` (a copy of the embeddings)
_OUTPUT_COPIED = frozenset({"gpt2"})
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def _refuse(model_dir: Path, what: str, hint: str) -> ModelLoadingError:
    return ModelLoadingError(f"cannot write a GGUF for {model_dir}: {what}", hint=hint)


def _check_writable(raw: JsonObject, model_dir: Path, arch: str) -> None:
    """DF004 for a model llama.cpp's graph would compute otherwise than ``transformers``."""
    act = raw.get("activation_function", raw.get("hidden_act", "gelu_new"))
    wanted = ("silu",) if arch == "stablelm" else _TANH_GELU
    if act not in wanted:
        raise _refuse(model_dir, f"activation {act!r}: llama.cpp's {arch} graph computes {wanted[0]}",
                      f"a model with the activation {wanted[0]}")
    if raw.get("qk_layernorm"):
        raise _refuse(model_dir, "per-head q/k LayerNorms (qk_layernorm) are not written", "a model without them")
    if raw.get("scale_attn_by_inverse_layer_idx") or raw.get("add_cross_attention"):
        raise _refuse(model_dir, "attention scaled by the inverse layer index, or cross-attention, which "
                      "llama.cpp's gpt2 graph does not compute", "a plain GPT-2")
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise _refuse(model_dir, f"rope scaling {scaling!r} is not written", "a model without rope scaling")


def add_generic_metadata(writer: object, arch: str, model: LoadedModel, file_type: int, name: str) -> None:
    """The keys llama.cpp reads for ``arch`` (``convert_hf_to_gguf.py``'s ``set_gguf_parameters``)."""
    import gguf

    raw, config = model.raw_config, model.config
    assert isinstance(config, GenericModelConfig)
    w = writer
    assert isinstance(w, gguf.GGUFWriter)
    w.add_name(name)
    w.add_block_count(config.num_hidden_layers)
    w.add_embedding_length(config.hidden_size)
    w.add_file_type(file_type)
    w.add_vocab_size(config.vocab_size)
    if arch == "gpt2":
        w.add_context_length(int(raw.get("n_positions", raw.get("n_ctx", 1024))))  # type: ignore[arg-type]
        w.add_feed_forward_length(int(raw.get("n_inner") or 4 * config.hidden_size))  # type: ignore[arg-type]
        w.add_head_count(int(raw["n_head"]))  # type: ignore[arg-type]
        w.add_layer_norm_eps(float(raw.get("layer_norm_epsilon", 1e-5)))  # type: ignore[arg-type]
        return
    heads = int(raw["num_attention_heads"])  # type: ignore[arg-type]
    if arch in ("stablelm", "phi2"):
        head_dim = config.hidden_size // heads
        share = raw.get("partial_rotary_factor")
        if share is None and isinstance(raw.get("rope_parameters"), dict):
            share = raw["rope_parameters"].get("partial_rotary_factor")  # type: ignore[union-attr]
        w.add_rope_dimension_count(int(float(share if isinstance(share, (int, float)) else 0.25) * head_dim))
        if arch == "stablelm":
            w.add_parallel_residual(bool(raw.get("use_parallel_residual", False)))
    w.add_context_length(config.max_position_embeddings)
    w.add_feed_forward_length(int(raw["intermediate_size"]))  # type: ignore[arg-type]
    w.add_head_count(heads)
    w.add_head_count_kv(int(raw.get("num_key_value_heads") or heads))  # type: ignore[arg-type]
    theta = raw.get("rope_theta")
    if theta is None and isinstance(raw.get("rope_parameters"), dict):
        theta = raw["rope_parameters"].get("rope_theta")  # type: ignore[union-attr]
    w.add_rope_freq_base(float(theta if isinstance(theta, (int, float)) else 10000.0))
    w.add_layer_norm_eps(float(raw.get("norm_epsilon", raw.get("layer_norm_eps", 1e-5))))  # type: ignore[arg-type]


def generic_architecture(model: LoadedModel, model_dir: Path) -> str:
    """The llama.cpp architecture ``model`` (a generic-tier model loaded from ``model_dir``) is
    written as; DF004 for one the writer does not handle or llama.cpp would compute otherwise."""
    config = model.config
    assert isinstance(config, GenericModelConfig)
    arch = GENERIC_GGUF_FAMILIES.get(config.model_type)
    if arch is None:
        raise _refuse(model_dir, f"model_type {config.model_type!r} is not one the GGUF writer handles",
                      "supported on the generic tier: " + ", ".join(sorted(GENERIC_GGUF_FAMILIES)))
    _check_writable(model.raw_config, model_dir, arch)
    return arch


def generic_tensors(model: LoadedModel, arch: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Every tensor of the file: (llama.cpp name, the array as Hugging Face stores it, the array the
    converter writes), GPT-2's tied head written as ``output.weight``."""
    names = gguf_names_of(build_skeleton(model.raw_config, meta=True, source=str(model.path)), arch,
                          model.num_layers)
    tensors: list[tuple[str, np.ndarray, np.ndarray]] = []
    for hf in model.weights:
        if hf in names:
            original = model.weights.numpy(hf, np.float32)
            tensors.append((names[hf], original, to_file_layout(arch, names[hf], original)))
    if arch in _OUTPUT_COPIED and all(g != "output.weight" for g, _, _ in tensors):
        embd = next(t for t in tensors if t[0] == "token_embd.weight")
        tensors.append(("output.weight", embd[1], embd[2]))
    return tensors
