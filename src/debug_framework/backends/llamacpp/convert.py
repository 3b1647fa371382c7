"""Write a GGUF from a Hugging Face model directory, the way llama.cpp's ``convert_hf_to_gguf.py`` does.

The file carries what llama.cpp needs to load and run the model without a tokenizer: the
architecture keys, a synthetic vocabulary of ``vocab_size`` tokens (token ids are fed directly;
no text is ever tokenized), and every tensor under llama.cpp's name. Llama-style models
(``llama``, ``mistral``) get their q/k rows permuted for llama.cpp's interleaved RoPE exactly as
the converter's ``LlamaModel.permute`` does; Qwen2, Qwen3, Phi-3 and Gemma are written unpermuted
(llama.cpp runs them in NeoX RoPE mode); Gemma's norm weights are written as ``1 + w`` and its
soft-caps and sliding window as keys; a mixture of experts' (Qwen3-MoE) per-expert projections are
stacked per layer (``blk.i.ffn_gate_exps`` ... ``[experts, out, in]``), its router kept F32.

``transform`` lets a caller change any tensor on its way into the file (tests inject converter
bugs with it: skip the permutation, swap or scale a tensor)::

    def skip_permutation(name: str, original: np.ndarray, converted: np.ndarray) -> np.ndarray:
        return original if name.endswith(("attn_q.weight", "attn_k.weight")) else converted

    write_gguf(hf_dir, out / "model.gguf", tensor_type="q8_0", transform=skip_permutation)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ModelLoadingError
from ...modelio.configs import GemmaModelConfig, LlamaModelConfig, MoeModelConfig
from ...modelio.gguf_model import MOE_ARCHS, expert_of
from ...modelio.gguf_model import gguf_name as hf_to_gguf
from ...modelio.loader import LoadedModel, load_model

__all__ = ["GGUF_TENSOR_TYPES", "GGUF_FAMILIES", "TensorTransform", "write_gguf", "permute_for_rope", "weight_type"]

#: (llama.cpp tensor name, the array as Hugging Face stores it, the array the converter writes)
#: -> the array to write. Arrays are float32, shaped as Hugging Face shapes them (out, in).
TensorTransform = Callable[[str, np.ndarray, np.ndarray], np.ndarray]

#: The tensor types a file can be written at (2-D weights; norms and biases stay F32 as in llama.cpp):
#: one type for every 2-D weight, or (``q4_k_m``, ``q5_k_m``) the mixture ``llama-quantize`` writes
#: under that name (:func:`weight_type`). The K-quants are quantized by ggml itself
#: (``ggml_quantize_chunk`` in the llama.cpp library of ``xllamacpp``, as ``llama-quantize`` does
#: without an importance matrix); the others by the ``gguf`` package.
GGUF_TENSOR_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                                      "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m")

#: ``llama-quantize``'s mixtures: name -> (most 2-D weights, the "more bits" ``attn_v`` / ``ffn_down``
#: layers, Phi-3's fused ``attn_qkv``); the output head (or a tied embedding) is Q6_K
_MIXTURES: dict[str, tuple[str, str, str]] = {"q4_k_m": ("q4_k", "q6_k", "q5_k"), "q5_k_m": ("q5_k", "q6_k", "q6_k")}

#: the type ``llama-quantize`` falls back to where a weight's rows are not whole blocks of the type
#: chosen (then F16 where they are not whole blocks of that either)
_FALLBACK: dict[str, str] = {"q2_k": "iq4_nl", "q3_k": "iq4_nl", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}

#: Hugging Face ``model_type`` -> llama.cpp architecture name.
GGUF_FAMILIES: dict[str, str] = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                                 "phi3": "phi3", "gemma2": "gemma2", "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe"}

#: ``model_type``s whose q/k rows the converter permutes (interleaved RoPE in llama.cpp).
_PERMUTED = frozenset({"llama", "mistral"})

@dataclass(frozen=True)
class _Tensor:
    """One tensor on its way into the file."""

    gguf_name: str
    original: np.ndarray
    converted: np.ndarray


def permute_for_rope(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: reorder each head's rows from Hugging Face's half-split
    RoPE layout to llama.cpp's interleaved one (q: ``n_head`` heads; k: ``n_head_kv`` heads)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _converted(config: LlamaModelConfig, hf_name: str, array: np.ndarray) -> np.ndarray:
    """The array as the converter writes it: q/k permuted for Llama-style RoPE, Gemma's norm
    weights stored as ``1 + w`` (llama.cpp multiplies by the stored weight)."""
    if isinstance(config, GemmaModelConfig) and hf_name.endswith("norm.weight"):
        return array + np.float32(1.0)
    if config.model_type not in _PERMUTED:
        return array
    if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return permute_for_rope(array, config.num_attention_heads, config.num_attention_heads)
    if hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return permute_for_rope(array, config.num_attention_heads, config.num_key_value_heads)
    return array


def _tensors(config: LlamaModelConfig, weights: dict[str, np.ndarray]) -> Iterator[_Tensor]:
    """Every tensor of the file, in Hugging Face's order (the output head left out when tied); a
    mixture of experts' per-expert projections stacked per layer as the converter stacks them
    (``blk.i.ffn_down_exps.weight`` ``[experts, out, in]``, expert 0 first), after the rest."""
    experts: dict[str, dict[int, np.ndarray]] = {}
    for hf_name, array in weights.items():
        expert = expert_of(hf_name)
        if expert is not None:
            experts.setdefault(expert[0], {})[expert[1]] = array
            continue
        gguf_name = hf_to_gguf(hf_name, GGUF_FAMILIES[config.model_type])
        if gguf_name is None or (gguf_name == "output.weight" and config.tie_word_embeddings):
            continue
        yield _Tensor(gguf_name, array, _converted(config, hf_name, array))
    for gguf_name, arrays in experts.items():
        stacked = np.stack([arrays[e] for e in sorted(arrays)])
        yield _Tensor(gguf_name, stacked, stacked)


def _generic_model(model_dir: Path) -> LoadedModel | None:
    """The directory's model where the generic tier runs it (no reference written from the math), else None."""
    model = load_model(model_dir)
    return model if model.architecture == "generic" else None


def _supported_config(model_dir: Path) -> tuple[LlamaModelConfig, dict[str, np.ndarray]]:
    """The directory's typed config and float32 weights; DF004 for a family the writer does not write."""
    model = load_model(model_dir)
    config = model.config
    if not isinstance(config, LlamaModelConfig) or config.model_type not in GGUF_FAMILIES:
        raise ModelLoadingError(
            f"cannot write a GGUF for {model_dir}: model_type {getattr(config, 'model_type', '?')!r} is not one "
            f"the GGUF writer handles", hint="supported: " + ", ".join(sorted(GGUF_FAMILIES)))
    if config.rope_scaling.rope_type not in ("default", "linear"):
        raise ModelLoadingError(
            f"cannot write a GGUF for {model_dir}: rope scaling {config.rope_scaling.rope_type!r} is not written",
            hint="write a model without rope_scaling, or with linear scaling")
    if isinstance(config, GemmaModelConfig):
        _check_gemma(config, model_dir)
    if isinstance(config, MoeModelConfig):
        _check_moe(config, model_dir)
    return config, {name: model.weights.numpy(name, np.float32) for name in model.weights}


def _check_gemma(config: GemmaModelConfig, model_dir: Path) -> None:
    """DF004 for what llama.cpp's Gemma graphs do not read: a ``query_pre_attn_scalar`` other than
    ``head_dim`` (llama.cpp scales queries by ``head_dim ** -0.5``), sliding-window layers other
    than its own pattern (Gemma 2: every other layer; Gemma 3: five of six), an untied output
    head, a local rope scaling."""
    if config.query_pre_attn_scalar != config.head_dim:
        raise ModelLoadingError(
            f"cannot write a GGUF for {model_dir}: query_pre_attn_scalar {config.query_pre_attn_scalar} is not "
            f"head_dim {config.head_dim}, and llama.cpp scales Gemma's queries by head_dim ** -0.5",
            hint="set query_pre_attn_scalar to head_dim")
    every = 2 if config.model_type == "gemma2" else 6
    pattern = tuple("sliding_attention" if (i + 1) % every else "full_attention"
                    for i in range(config.num_hidden_layers))
    if config.sliding_window is None or config.layer_types != pattern:
        raise ModelLoadingError(
            f"cannot write a GGUF for {model_dir}: its sliding-window layers are not llama.cpp's "
            f"{config.model_type} pattern (one global layer in {every})",
            hint="a model with the family's default layer_types and a sliding_window")
    if not config.tie_word_embeddings:
        raise ModelLoadingError(f"cannot write a GGUF for {model_dir}: llama.cpp's Gemma reads no output head "
                                "(it ties it to the embeddings)", hint="a model with tie_word_embeddings=true")
    if config.local_rope_scaling.rope_type != "default":
        raise ModelLoadingError(f"cannot write a GGUF for {model_dir}: a rope scaling of the local layers is not "
                                "written", hint="write a model without one")


def _check_moe(config: MoeModelConfig, model_dir: Path) -> None:
    """DF004 for a mixture of experts llama.cpp's graph computes otherwise: its experts' weights
    renormalised (or not) whatever ``norm_topk_prob`` says (:data:`~debug_framework.modelio.gguf_model.MOE_ARCHS`),
    and no sliding window."""
    architecture = GGUF_FAMILIES[config.model_type]
    if config.norm_topk_prob != MOE_ARCHS[architecture]:
        raise ModelLoadingError(
            f"cannot write a GGUF for {model_dir}: norm_topk_prob is {config.norm_topk_prob}, and llama.cpp's "
            f"{architecture} graph {'always' if MOE_ARCHS[architecture] else 'never'} renormalises the chosen "
            "experts' weights", hint=f"a model with norm_topk_prob={str(MOE_ARCHS[architecture]).lower()}")
    if config.sliding_window is not None:
        raise ModelLoadingError(f"cannot write a GGUF for {model_dir}: llama.cpp's {architecture} graph has no "
                                "sliding window", hint="a model with use_sliding_window=false")


def _add_moe_metadata(writer: object, config: MoeModelConfig) -> None:
    """A mixture of experts' keys: how many experts, how many each token takes, their width."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)


def _add_gemma_metadata(writer: object, config: GemmaModelConfig) -> None:
    """Gemma's keys: soft-caps, the sliding window, Gemma 3's local rope base."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    assert config.sliding_window is not None
    writer.add_sliding_window(config.sliding_window)
    if config.attn_logit_softcapping is not None:
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    if config.final_logit_softcapping is not None:
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if config.local_rope_theta is not None:
        writer.add_rope_freq_base_swa(config.local_rope_theta)


def _add_metadata(writer: object, config: LlamaModelConfig, file_type: int, name: str) -> None:
    """The architecture keys llama.cpp reads for the family."""
    import gguf

    w = writer  # gguf.GGUFWriter
    assert isinstance(w, gguf.GGUFWriter)
    w.add_name(name)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    if config.rope_scaling.rope_type == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(config.rope_scaling.factor)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)
    w.add_file_type(file_type)
    if isinstance(config, GemmaModelConfig):
        _add_gemma_metadata(w, config)
    if isinstance(config, MoeModelConfig):
        _add_moe_metadata(w, config)


#: control tokens llama.cpp looks up by their text when it loads a family's vocabulary
_NAMED_TOKENS: dict[str, tuple[str, ...]] = {"phi3": ("<|endoftext|>", "<|end|>", "<|assistant|>", "<|user|>",
                                                      "<|system|>")}


def _add_synthetic_vocabulary(writer: object, vocab_size: int, architecture: str) -> None:
    """A SentencePiece-typed vocabulary of ``vocab_size`` placeholder tokens (ids 0-2 are
    ``<unk>``, ``<s>``, ``</s>``, then the control tokens llama.cpp looks up for the family):
    enough for llama.cpp to load the model and decode token ids."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    named = ("<unk>", "<s>", "</s>", *_NAMED_TOKENS.get(architecture, ()))
    special = {i: text for i, text in enumerate(named) if i < vocab_size}
    tokens = [special.get(i, f"<tok_{i}>") for i in range(vocab_size)]
    types = [gguf.TokenType.UNKNOWN if i == 0 else gguf.TokenType.CONTROL if i in special
             else gguf.TokenType.NORMAL for i in range(vocab_size)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    if vocab_size > 2:
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def _file_type(tensor_type: str) -> int:
    """``general.file_type`` for a tensor type (a single K-quant type is called by the ``_S`` file
    type of its name, the nearest of llama.cpp's)."""
    import gguf

    names = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
             "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1", "q5_0": "MOSTLY_Q5_0", "q5_1": "MOSTLY_Q5_1",
             "q2_k": "MOSTLY_Q2_K", "q3_k": "MOSTLY_Q3_K_S", "q4_k": "MOSTLY_Q4_K_S", "q5_k": "MOSTLY_Q5_K_S",
             "q6_k": "MOSTLY_Q6_K", "q4_k_m": "MOSTLY_Q4_K_M", "q5_k_m": "MOSTLY_Q5_K_M"}
    return int(gguf.LlamaFileType[names[tensor_type]])


#: the weights ``llama-quantize``'s mixtures give more bits in some layers (its ``ffn_down`` category
#: takes a mixture of experts' stacked ``ffn_down_exps`` too)
_MORE_BITS = ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")


def _more_bits(layer: int, layers: int) -> bool:
    """``llama-quantize``'s ``use_more_bits``: the first and last eighth of the layers, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _block(tensor_type: str) -> int:
    import gguf

    return int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[tensor_type.upper()]][0])


def weight_type(name: str, row_length: int, tensor_type: str, layers: int, has_output: bool) -> str:
    """The type a 2-D weight ``name`` (llama.cpp's name, rows of ``row_length``) is written at in a
    file of ``tensor_type``: that type; in a mixture (``q4_k_m``, ``q5_k_m``) what ``llama-quantize``
    chooses for a dense model (Q6_K for the output head, or the token embedding where it is tied;
    Q6_K for ``attn_v`` and ``ffn_down`` in the first and last eighth of the layers and every third
    layer between; Q5_K (``q4_k_m``) / Q6_K (``q5_k_m``) for a fused ``attn_qkv``; the K-quant of its
    name elsewhere). Rows that are not whole blocks of the type fall back as ``llama-quantize``
    falls back (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K/Q3_K to IQ4_NL), then to F16 as
    llama.cpp's converter does (and the head to Q8_0, as ``llama-quantize`` chooses it)."""
    if name.endswith("ffn_gate_inp.weight"):
        return "f32"  # a mixture of experts' router: kept in F32 by the converter and by llama-quantize
    chosen = tensor_type
    if tensor_type in _MIXTURES:
        main, more, fused = _MIXTURES[tensor_type]
        parts = name.split(".")
        layer = int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else -1
        if name == "output.weight" or (not has_output and name == "token_embd.weight"):
            chosen = "q8_0" if row_length % _block("q6_k") else "q6_k"
        elif name.endswith(_MORE_BITS) and _more_bits(layer, layers):
            chosen = more
        elif name.endswith("attn_qkv.weight"):
            chosen = fused
        else:
            chosen = main
    if chosen in ("f32", "f16", "bf16") or row_length % _block(chosen) == 0:
        return chosen
    fallback = _FALLBACK.get(chosen, "f16")
    return fallback if row_length % _block(fallback) == 0 else "f16"


def _encoded(array: np.ndarray, tensor_type: str) -> tuple[np.ndarray, object]:
    """The bytes (or plain array) to store and their GGML type: 1-D tensors stay F32 as in llama.cpp;
    a 2-D weight is quantized at ``tensor_type`` (chosen by :func:`weight_type`), by ggml's own
    quantizer for the K-quants and IQ4_NL, else by the ``gguf`` package."""
    import gguf

    qtype = gguf.GGMLQuantizationType[tensor_type.upper()]
    data = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim < 2 or qtype == gguf.GGMLQuantizationType.F32:
        return data, gguf.GGMLQuantizationType.F32
    from .binding import GGML_QUANTIZED, ggml_quantize_rows, library

    if tensor_type.upper() in GGML_QUANTIZED:  # the K-quants and IQ4_NL: ggml's own quantizer
        rows = ggml_quantize_rows(library(), data.reshape(-1, data.shape[-1]), tensor_type)
        return rows.reshape(*data.shape[:-1], rows.shape[-1]), qtype
    return gguf.quants.quantize(data, qtype), qtype


def write_gguf(model_dir: Path | str, out_path: Path | str, *, tensor_type: str = "f32",
               transform: TensorTransform | None = None) -> Path:
    """Write the Hugging Face model in ``model_dir`` as a GGUF at ``out_path`` and return the path.

    Args:
        model_dir: a Hugging Face directory of a Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2,
            Gemma 3 (text) or Qwen3-MoE decoder, or of a model the generic tier runs whose
            architecture the writer handles (GPT-2, StarCoder2, StableLM, Phi-2: :mod:`.convert_generic`).
        out_path: the file to write (its directory must exist).
        tensor_type: the type of every 2-D weight, or a mixture of ``llama-quantize``'s
            (``q4_k_m``, ``q5_k_m``), one of :data:`GGUF_TENSOR_TYPES`; norms and biases stay F32,
            and a weight whose rows do not fill whole blocks falls back as llama.cpp's tools do
            (:func:`weight_type`). The K-quants need the ``xllamacpp`` wheel (ggml's quantizer).
        transform: called for every tensor with its llama.cpp name, the float32 array as Hugging
            Face stores it and the array the converter would write; its result is written (a
            stacked expert tensor is seen whole: ``converted[2]`` is expert 2).

    Raises:
        ModelLoadingError: (DF004) the directory does not load, its family or rope scaling is
            not one the writer handles, it has what llama.cpp's graph of its family does not compute
            (Gemma's, a mixture of experts' refusals), or ``tensor_type`` is unknown.
        BackendInitializationError: (DF002) a K-quant asked for and the llama.cpp library not installed.
    """
    import gguf

    if tensor_type not in GGUF_TENSOR_TYPES:
        raise ModelLoadingError(f"unknown GGUF tensor type {tensor_type!r}",
                                hint="one of " + ", ".join(GGUF_TENSOR_TYPES))
    model_dir, out_path = Path(model_dir), Path(out_path)
    generic = _generic_model(model_dir)
    if generic is not None:  # an architecture the generic tier runs (GPT-2 ...): .convert_generic
        from .convert_generic import add_generic_metadata, generic_architecture, generic_tensors

        arch = generic_architecture(generic, model_dir)
        writer = gguf.GGUFWriter(str(out_path), arch)
        add_generic_metadata(writer, arch, generic, _file_type(tensor_type), model_dir.name or "model")
        tensors = [_Tensor(*t) for t in generic_tensors(generic, arch)]
        layers, vocab = generic.num_layers, generic.config.vocab_size
    else:
        config, weights = _supported_config(model_dir)
        arch = GGUF_FAMILIES[config.model_type]
        writer = gguf.GGUFWriter(str(out_path), arch)
        _add_metadata(writer, config, _file_type(tensor_type), model_dir.name or "model")
        tensors = list(_tensors(config, weights))
        layers, vocab = config.num_hidden_layers, config.vocab_size
    _add_synthetic_vocabulary(writer, vocab, arch)
    has_output = any(t.gguf_name == "output.weight" for t in tensors)
    for tensor in tensors:
        array = tensor.converted if transform is None else transform(tensor.gguf_name, tensor.original,
                                                                     tensor.converted)
        array = np.asarray(array, dtype=np.float32)
        kind = "f32" if array.ndim < 2 else weight_type(tensor.gguf_name, array.shape[-1], tensor_type,
                                                          layers, has_output)
        data, qtype = _encoded(array, kind)
        writer.add_tensor(tensor.gguf_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
