"""A GGUF of an architecture without a reference written from the math, as a generic-tier model.

The file's metadata becomes a ``config.json`` of the Hugging Face ``model_type`` it was converted
from (transformers' own GGUF key table, ``GGUF_CONFIG_MAPPING``, then what that table leaves out
or reads wrong for the architecture: :data:`GENERIC_GGUF_ARCHITECTURES`), checked and typed as a
:class:`~.generic.GenericModelConfig`; the model's own eager ``transformers`` code then judges it
(the generic tier: ``float64_eager``). Its tensors are read dequantized under the names of that
``transformers`` model: llama.cpp's name of each of the model's parameters comes from the ``gguf``
package's own table (``get_tensor_name_map``, the table llama.cpp's ``convert_hf_to_gguf.py``
writes with), looked up on the model built on the ``meta`` device (no memory), and what the
converter changed on the way in is undone (GPT-2's ``Conv1D`` weights, which it transposes).

The file is read by our structural reader only (:func:`~.gguf_read.read_gguf`: a malformed file is
DF004 before anything else parses it); each tensor is dequantized to float32 when it is read,
never the whole model at once, never to float64.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelLoadingError
from ..jsonio import JsonObject
from .generic import GenericModelConfig, build_skeleton, generic_config, tied_names
from .gguf_read import GgufFile

if TYPE_CHECKING:
    import torch

    from .weights import TensorReader

__all__ = ["GENERIC_GGUF_ARCHITECTURES", "GenericGgufArchitecture", "GenericGgufReader", "generic_gguf_config",
           "generic_gguf_parts", "gguf_names_of", "to_file_layout"]


def _gpt2(f: GgufFile) -> JsonObject:
    """GPT-2: learned positions of ``context_length``, the MLP width (transformers' table reads it
    under a name GPT-2's config does not have), the tanh GELU llama.cpp's graph computes."""
    return {"n_positions": f.positive_int("context_length"), "n_ctx": f.positive_int("context_length"),
            "n_inner": f.positive_int("feed_forward_length"), "activation_function": "gelu_new",
            "layer_norm_epsilon": f.number("attention.layer_norm_epsilon", 1e-5)}


def _starcoder2(f: GgufFile) -> JsonObject:
    """StarCoder2: the rope base (not in transformers' table), biases where the file has them, the
    tanh GELU; no sliding window (llama.cpp's ``starcoder2`` graph attends to every cached token)."""
    return {"rope_theta": f.number("rope.freq_base", 10000.0), "use_bias": "blk.0.attn_q.bias" in f.tensors,
            "hidden_act": "gelu_pytorch_tanh", "norm_epsilon": f.number("attention.layer_norm_epsilon", 1e-5),
            "sliding_window": None}


def _stablelm(f: GgufFile) -> JsonObject:
    """StableLM: the rotated share of each head (``rope.dimension_count``), the rope base, biases
    where the file has them, a parallel attention+MLP block where it has no ``ffn_norm`` (llama.cpp's
    own rule), the SiLU-gated MLP."""
    heads = f.positive_int("attention.head_count")
    head_dim = f.positive_int("embedding_length") // heads
    rotated = f.positive_int("rope.dimension_count", head_dim)
    return {"partial_rotary_factor": rotated / head_dim, "rope_theta": f.number("rope.freq_base", 10000.0),
            "use_qkv_bias": "blk.0.attn_q.bias" in f.tensors, "qk_layernorm": False,
            "use_parallel_residual": "blk.0.ffn_norm.weight" not in f.tensors, "hidden_act": "silu",
            "layer_norm_eps": f.number("attention.layer_norm_epsilon", 1e-5)}


def _phi2(f: GgufFile) -> JsonObject:
    """Phi-2 (Hugging Face ``phi``; transformers' GGUF table has no ``phi2``): every size from the
    metadata, the rotated share of each head, the tanh GELU; attention and MLP in parallel."""
    heads = f.positive_int("attention.head_count")
    hidden = f.positive_int("embedding_length")
    return {"hidden_size": hidden, "intermediate_size": f.positive_int("feed_forward_length"),
            "num_hidden_layers": f.positive_int("block_count"), "num_attention_heads": heads,
            "num_key_value_heads": f.positive_int("attention.head_count_kv", heads),
            "max_position_embeddings": f.positive_int("context_length"),
            "partial_rotary_factor": f.positive_int("rope.dimension_count", hidden // heads) / (hidden // heads),
            "rope_theta": f.number("rope.freq_base", 10000.0), "hidden_act": "gelu_new", "qk_layernorm": False,
            "layer_norm_eps": f.number("attention.layer_norm_epsilon", 1e-5)}


@dataclass(frozen=True)
class GenericGgufArchitecture:
    """How a llama.cpp architecture maps onto the ``transformers`` model it was converted from.

    Attributes:
        model_type: the Hugging Face ``model_type``.
        config: the keys transformers' GGUF table (``GGUF_CONFIG_MAPPING``) leaves out or reads
            under another name, from the file's metadata.
        transposed: llama.cpp tensor kinds (``attn_qkv``) whose weight the converter stores
            transposed (GPT-2's ``Conv1D`` keeps ``[in, out]``; llama.cpp wants ``[out, in]``).
    """

    model_type: str
    config: Callable[[GgufFile], JsonObject]
    transposed: frozenset[str] = frozenset()


#: llama.cpp architecture -> how it maps onto its ``transformers`` model (each one written by the
#: converter's rules in the llama.cpp engine's GGUF writer, loaded and run by llama.cpp and judged
#: in the tests)
GENERIC_GGUF_ARCHITECTURES: dict[str, GenericGgufArchitecture] = {
    "gpt2": GenericGgufArchitecture("gpt2", _gpt2, frozenset({"attn_qkv", "attn_output", "ffn_up", "ffn_down"})),
    "starcoder2": GenericGgufArchitecture("starcoder2", _starcoder2),
    "stablelm": GenericGgufArchitecture("stablelm", _stablelm),
    "phi2": GenericGgufArchitecture("phi", _phi2),
}


def _table_keys(f: GgufFile) -> JsonObject:
    """The file's keys transformers' own GGUF table (``GGUF_CONFIG_MAPPING``) names, as it names them."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    out: JsonObject = {}
    for key, hf in GGUF_CONFIG_MAPPING.get(f.architecture, {}).items():
        value = f.key(key)
        if isinstance(hf, str) and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[hf] = value
    return out


def _check_heads(f: GgufFile) -> None:
    """The attention's geometry as the metadata claims it, checked before any model is built from
    it (DF004): whole heads of the width, whole query heads per KV head, a rotated share that fits."""
    heads, hidden = f.positive_int("attention.head_count"), f.positive_int("embedding_length")
    kv = f.positive_int("attention.head_count_kv", heads)
    if hidden % heads or heads % kv:
        raise ModelLoadingError(f"GGUF keys claim {heads} heads ({kv} key/value heads) over a width of {hidden}: "
                                "not whole heads", file=str(f.path))
    if f.positive_int("rope.dimension_count", hidden // heads) > hidden // heads:
        raise ModelLoadingError(f"GGUF key {f.architecture}.rope.dimension_count is larger than a head "
                                f"({hidden // heads})", file=str(f.path))


def generic_gguf_config(f: GgufFile) -> JsonObject:
    """The file's metadata as the ``config.json`` of its ``transformers`` model (DF004 for an
    architecture not in :data:`GENERIC_GGUF_ARCHITECTURES` or metadata of the wrong type)."""
    arch = GENERIC_GGUF_ARCHITECTURES.get(f.architecture)
    if arch is None:
        raise ModelLoadingError(f"GGUF architecture {f.architecture!r} is not read on the generic tier",
                                file=str(f.path), hint="architectures read: " + ", ".join(GENERIC_GGUF_ARCHITECTURES))
    if "token_embd.weight" not in f.tensors or len(f.tensors["token_embd.weight"].shape) != 2:
        raise ModelLoadingError("the GGUF has no two-dimensional token_embd.weight", file=str(f.path))
    f.positive_int("block_count")
    _check_heads(f)
    if any(f"blk.0.{n}.weight" in f.tensors for n in ("attn_q_norm", "attn_k_norm")):
        raise ModelLoadingError(f"the {f.architecture} GGUF has per-head query/key norms (attn_q_norm, "
                                "attn_k_norm), which its reading on the generic tier does not map",
                                file=str(f.path), hint="validate the Hugging Face model it was converted from")
    raw: JsonObject = {**_table_keys(f), **arch.config(f), "model_type": arch.model_type,
                       "vocab_size": f.tensors["token_embd.weight"].shape[0],
                       "tie_word_embeddings": "output.weight" not in f.tensors}
    return raw


def gguf_names_of(net: torch.nn.Module, architecture: str, num_layers: int) -> dict[str, str]:
    """Hugging Face parameter name -> llama.cpp tensor name, for every parameter of ``net`` (a
    ``transformers`` model, on the ``meta`` device) the ``gguf`` package's table names; the same
    table llama.cpp's converter writes with (``transformer.h.0.attn.c_attn.weight`` ->
    ``blk.0.attn_qkv.weight``)."""
    import gguf

    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == architecture), None)
    if arch is None:
        raise ModelLoadingError(f"the gguf package has no architecture {architecture!r}",
                                hint="pip install -U gguf")
    table = gguf.get_tensor_name_map(arch, num_layers)
    out: dict[str, str] = {}
    for name, _ in net.named_parameters(remove_duplicate=False):
        base, _, suffix = name.rpartition(".")
        mapped = table.get_name(base)
        if mapped is not None and suffix in ("weight", "bias"):
            out[name] = f"{mapped}.{suffix}"
    return out


def _kind(gguf_name: str) -> str:
    """``attn_qkv`` of ``blk.0.attn_qkv.weight``; ``output`` of ``output.weight``."""
    parts = gguf_name.split(".")
    return parts[2] if len(parts) == 4 and parts[0] == "blk" else parts[0]


def _transposed(architecture: str, gguf_name: str, ndim: int) -> bool:
    """Whether the converter stores tensor ``gguf_name`` of an ``architecture`` file transposed."""
    arch = GENERIC_GGUF_ARCHITECTURES[architecture]
    return ndim == 2 and gguf_name.endswith(".weight") and _kind(gguf_name) in arch.transposed


def to_file_layout(architecture: str, gguf_name: str, array: np.ndarray) -> np.ndarray:
    """A Hugging Face tensor as the converter writes it into an ``architecture`` file (GPT-2's
    ``Conv1D`` weights transposed); its own inverse."""
    if _transposed(architecture, gguf_name, array.ndim):
        return np.ascontiguousarray(array.T)
    return array


#: (file, size, modification time) -> its Hugging Face -> llama.cpp names (found once per file)
_NAMES: dict[tuple[str, int, int], dict[str, str]] = {}


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


class GenericGgufReader:
    """The tensors of a generic-tier GGUF under the ``transformers`` model's names (a
    ``TensorReader``): dequantized to float32 one tensor at a time, in the model's own layout."""

    def __init__(self, path: Path, header: GgufFile | None = None, names: dict[str, str] | None = None) -> None:
        from .gguf_read import read_gguf

        self.path = Path(path)
        self.file = header if header is not None else read_gguf(self.path)
        key = _file_key(self.path)
        if names is None:  # a store's fork opens the file anew: the names the first reader found
            names = _NAMES.get(key)
        if names is None:
            raise ModelLoadingError(f"the GGUF {self.path} changed on disk while it was being validated",
                                    file=str(self.path), hint="leave the file as it is during a session, and run again")
        _NAMES[key] = names
        #: Hugging Face name -> llama.cpp name, for the tensors the file holds
        self._names = {h: g for h, g in names.items() if g in self.file.tensors}

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        stored = self._names[name]
        shape = self.file.tensors[stored].shape
        return tuple(reversed(shape)) if _transposed(self.file.architecture, stored, len(shape)) else shape

    def dtype(self, name: str) -> str:
        return "F32"  # what tensor() returns; the stored type is GgufFile.tensor_types()

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 NumPy, in the ``transformers`` model's layout."""
        stored = self._names[name]
        return np.ascontiguousarray(to_file_layout(self.file.architecture, stored, self.file.read(stored)))

    def tensor(self, name: str) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.array(name))


def generic_gguf_parts(header: GgufFile) -> tuple[GenericModelConfig, JsonObject, dict[str, tuple[TensorReader, str]],
                                                  dict[str, tuple[int, ...]]]:
    """A generic-tier GGUF's typed config, its ``config.json``, where each tensor is, and what the
    ``transformers`` model reads (name -> shape, the tied ones left out): what ``load_model`` checks.

    Raises:
        ModelLoadingError: (DF004) an architecture not read here, metadata transformers cannot
            build a model from.
    """
    from ..capture.structure import layer_stacks, static_router

    from .checks import check_sizes_fit

    raw = generic_gguf_config(header)
    source = str(header.path)
    config = generic_config(raw, source=source, why=f"a {header.architecture} GGUF: no reference written from "
                                                    "the math for its family")
    # the sizes it claims bounded by what the file holds before a model of them is built (meta device)
    check_sizes_fit(config, [t.shape for t in header.tensors.values()], source)  # type: ignore[arg-type]
    net = build_skeleton(raw, meta=True, source=source)
    names = gguf_names_of(net, header.architecture, config.num_layers)
    reader = GenericGgufReader(header.path, header, names)
    tied = tied_names(net)
    params = {n for n, _ in net.named_parameters(remove_duplicate=False)}
    expected = {n: tuple(t.shape) for n, t in net.state_dict().items() if n in params and n not in tied}
    modules = dict(net.named_modules())
    routed = tuple(i for i, name in enumerate(layer_stacks(net, config.num_layers))
                   if static_router(modules[name]) is not None)
    config = dataclasses.replace(config, router_layers=routed)
    return config, raw, {name: (reader, name) for name in reader.names()}, expected

