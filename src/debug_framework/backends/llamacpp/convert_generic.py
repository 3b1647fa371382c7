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
from ...modelio.generic import GenericModelConfig, build_skeleton, hf_config_of, tied_names
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


def _rope(hf: object, key: str, default: float) -> float:
    """A rope parameter of a ``transformers`` config (``rope_parameters`` in transformers 5, else
    the config's own attribute), ``default`` where it has none."""
    params = getattr(hf, "rope_parameters", None)
    value = params.get(key) if isinstance(params, dict) else None
    value = getattr(hf, key, None) if value is None else value
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _check_writable(hf: object, model_dir: Path, arch: str) -> None:
    """DF004 for a model llama.cpp's graph would compute otherwise than ``transformers`` (``hf``:
    its ``transformers`` config, defaults filled in)."""
    act = getattr(hf, "activation_function", None) or getattr(hf, "hidden_act", None)
    wanted = ("silu",) if arch == "stablelm" else _TANH_GELU
    if act not in wanted:
        raise _refuse(model_dir, f"activation {act!r}: llama.cpp's {arch} graph computes {wanted[0]}",
                      f"a model with the activation {wanted[0]}")
    if getattr(hf, "qk_layernorm", False):
        raise _refuse(model_dir, "per-head q/k LayerNorms (qk_layernorm) are not written", "a model without them")
    if getattr(hf, "scale_attn_by_inverse_layer_idx", False) or getattr(hf, "add_cross_attention", False) \
            or getattr(hf, "scale_attn_weights", True) is False:
        raise _refuse(model_dir, "attention scaled by the inverse layer index, unscaled, or cross-attention, "
                      "which llama.cpp's gpt2 graph does not compute", "a plain GPT-2")
    scaling = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise _refuse(model_dir, f"rope scaling {scaling!r} is not written", "a model without rope scaling")


def add_generic_metadata(writer: object, arch: str, model: LoadedModel, file_type: int, name: str) -> None:
    """The keys llama.cpp reads for ``arch`` (``convert_hf_to_gguf.py``'s ``set_gguf_parameters``),
    from the model's ``transformers`` config (its defaults filled in where config.json leaves a key out)."""
    import gguf

    config = model.config
    assert isinstance(config, GenericModelConfig)
    hf = hf_config_of(model.raw_config, str(model.path))
    w = writer
    assert isinstance(w, gguf.GGUFWriter)
    w.add_name(name)
    w.add_block_count(config.num_hidden_layers)
    w.add_embedding_length(config.hidden_size)
    w.add_file_type(file_type)
    w.add_vocab_size(config.vocab_size)
    if arch == "gpt2":
        w.add_context_length(int(hf.n_positions))
        w.add_feed_forward_length(int(hf.n_inner or 4 * config.hidden_size))
        w.add_head_count(int(hf.n_head))
        w.add_layer_norm_eps(float(hf.layer_norm_epsilon))
        return
    heads = int(hf.num_attention_heads)
    if arch in ("stablelm", "phi2"):
        w.add_rope_dimension_count(int(_rope(hf, "partial_rotary_factor", 1.0) * (config.hidden_size // heads)))
        if arch == "stablelm":
            w.add_parallel_residual(bool(getattr(hf, "use_parallel_residual", False)))
    w.add_context_length(config.max_position_embeddings)
    w.add_feed_forward_length(int(hf.intermediate_size))
    w.add_head_count(heads)
    w.add_head_count_kv(int(getattr(hf, "num_key_value_heads", None) or heads))
    w.add_rope_freq_base(_rope(hf, "rope_theta", 10000.0))
    eps = getattr(hf, "norm_epsilon", None) or getattr(hf, "layer_norm_eps", None)
    w.add_layer_norm_eps(float(eps if eps is not None else 1e-5))


def generic_architecture(model: LoadedModel, model_dir: Path) -> str:
    """The llama.cpp architecture ``model`` (a generic-tier model loaded from ``model_dir``) is
    written as; DF004 for one the writer does not handle or llama.cpp would compute otherwise."""
    config = model.config
    assert isinstance(config, GenericModelConfig)
    arch = GENERIC_GGUF_FAMILIES.get(config.model_type)
    if arch is None:
        raise _refuse(model_dir, f"model_type {config.model_type!r} is not one the GGUF writer handles",
                      "supported on the generic tier: " + ", ".join(sorted(GENERIC_GGUF_FAMILIES)))
    _check_writable(hf_config_of(model.raw_config, str(model_dir)), model_dir, arch)
    return arch


def generic_tensors(model: LoadedModel, arch: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Every tensor of the file: (llama.cpp name, the array as Hugging Face stores it, the array the
    converter writes), GPT-2's tied head written as ``output.weight``."""
    net = build_skeleton(model.raw_config, meta=True, source=str(model.path))
    names = gguf_names_of(net, arch, model.num_layers)
    missing = sorted(set(names) - set(model.weights) - set(tied_names(net)))
    if missing:  # a checkpoint whose names the model does not have (renamed, or without the model's prefix)
        raise _refuse(model.path, f"its weights have no {missing[0]} ({len(missing)} of the model's tensors missing)",
                      "save the model with transformers' save_pretrained and write that directory")
    tensors: list[tuple[str, np.ndarray, np.ndarray]] = []
    for hf in model.weights:
        if hf in names:
            original = model.weights.numpy(hf, np.float32)
            tensors.append((names[hf], original, to_file_layout(arch, names[hf], original)))
    embd = next((t for t in tensors if t[0] == "token_embd.weight"), None)
    if embd is None:
        raise _refuse(model.path, "it has no token embeddings", "a model with its token embeddings")
    if arch in _OUTPUT_COPIED and all(g != "output.weight" for g, _, _ in tensors):
        tensors.append(("output.weight", embd[1], embd[2]))
    return tensors
