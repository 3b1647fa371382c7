"""llama.cpp's precision reproduced in a generic-tier model's own eager ``transformers`` code.

For a GGUF whose family has no reference written from the math (GPT-2, StarCoder2, StableLM, Phi-2:
:mod:`debug_framework.modelio.gguf_generic`), the calibration at ``--dtype auto`` is the model's
own eager code in float32 (``float64_eager``'s code, :class:`LlamaEagerEmulationBackend`) with
what llama.cpp rounds rounded the same way, by means that hold for any ``transformers`` model:

* **weights at the file's types**: a GGUF's own are read as stored (dequantized, they are the
  file's values); a Hugging Face model's are re-quantized to the file's types in the file's
  layout (:func:`~.precision.requantized`, GPT-2's ``Conv1D`` weights transposed first);
* **activations quantized before a quantized matrix product**: a forward pre-hook on every
  ``nn.Linear`` / ``Conv1D`` whose weight the file stores quantized (or at F16) rounds its input
  as ggml's kernel converts it (:func:`~.precision.quantize_activations`: Q8_0 / Q8_1 blocks of
  32, Q8_K blocks of 256, F16), the LM head by the type of ``output.weight`` (or of the token
  embeddings it is tied to);
* **keys and values at the KV cache's type**, and queries as F16 where the cache is F16, through
  transformers' attention-function registry (``ALL_ATTENTION_FUNCTIONS``): the model's own
  ``eager_attention_forward`` called on the rounded tensors (after the rotation and the cache);
* **the tanh GELU through ggml's float16 table** (:func:`~.precision.gelu_fp16_table`) on every
  tanh-GELU activation module.

Not reproduced: an expert's matrix product in a mixture of experts written as stacked parameters
(not a module: its input is not hooked); attention's own products beyond the cache's rounding
(ggml's F16 ``kq``/``kqv`` accumulation order), as in the from-math emulation.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...errors import BackendInitializationError
from ...modelio.generic import tied_names
from .._attention_rows import eager_in_row_blocks
from ..eager_reference import EagerReferenceBackend
from .precision import _REQUANTIZED, VEC_DOT, LlamaPrecision, _cache_key, cache_roundings, gelu_fp16_table, \
    input_rounding, requantized

if TYPE_CHECKING:
    import torch
    from numpy.typing import DTypeLike

    from ...jsonio import JsonObject
    from ...modelio.loader import LoadedModel

__all__ = ["GenericLlamaPrecision", "LlamaEagerEmulationBackend", "CACHE_ROUNDED_ATTENTION", "emulation_limits",
           "generic_gguf_names"]

#: the name the cache-rounding attention is registered under in transformers' registries
CACHE_ROUNDED_ATTENTION = "llamacpp_cache_rounded"

#: ``transformers`` activation modules of the tanh GELU (ggml computes it through its float16 table)
_TANH_GELU_MODULES = frozenset({"NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation"})

#: module classes whose ``weight`` is a matrix product's (``Conv1D``: GPT-2's, stored ``[in, out]``)
_MATMUL_MODULES = frozenset({"Linear", "Conv1D"})

Rounding = Callable[["torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class GenericLlamaPrecision(LlamaPrecision):
    """:class:`~.precision.LlamaPrecision` of a generic-tier file: its trusted implementation is the
    model's own eager code at that precision (:class:`LlamaEagerEmulationBackend`)."""

    architecture: str = ""

    @classmethod
    def of(cls, precision: LlamaPrecision, architecture: str) -> GenericLlamaPrecision:
        """``precision`` of a file of llama.cpp ``architecture``, judged on the generic tier."""
        values = {f.name: getattr(precision, f.name) for f in dataclasses.fields(LlamaPrecision)}
        return cls(**values, architecture=architecture)

    def trusted_backend(self) -> LlamaEagerEmulationBackend:  # type: ignore[override]
        return LlamaEagerEmulationBackend(self)


def cache_rounded_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, **kwargs: object) -> tuple[torch.Tensor, object]:
    """The model's own eager attention (a block of query rows at a time, as the reference's) on
    keys and values rounded to the KV cache's type (and queries to F16 where the cache is F16), as
    the emulating backend set them for ``module`` (:data:`_CACHE_ROUNDING`); registered as
    :data:`CACHE_ROUNDED_ATTENTION`."""
    round_q, round_k, round_v = _CACHE_ROUNDING[module]
    return eager_in_row_blocks(module, round_q(query), round_k(key), round_v(value), attention_mask, **kwargs)


#: each emulating model's attention module -> how its queries, keys and values are rounded (kept
#: beside the model, not on its config: a config is serialised, and shared by its copies)
_CACHE_ROUNDING: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Rounding, Rounding, Rounding]] = weakref.WeakKeyDictionary()


def _register_attention() -> None:
    """:func:`cache_rounded_attention` in transformers' attention registry, with the eager mask."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(CACHE_ROUNDED_ATTENTION, cache_rounded_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CACHE_ROUNDED_ATTENTION, eager_mask)


class _Requantized(Mapping[str, "torch.Tensor"]):
    """A Hugging Face model's weights re-quantized to a GGUF's types in the file's layout (what
    llama.cpp holds of them), float32; each tensor a fresh array, so the model built on them owns
    it (:attr:`private`)."""

    def __init__(self, model: LoadedModel, names: dict[str, str], types: dict[str, str], architecture: str) -> None:
        self.model, self.names_map, self.types, self.architecture = model, names, types, architecture

    def __getitem__(self, name: str) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.array(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.model.weights)

    def __len__(self) -> int:
        return len(self.model.weights)

    def __contains__(self, name: object) -> bool:
        return name in self.model.weights

    @property
    def private(self) -> bool:
        """Every tensor handed out is a copy of its own."""
        return True

    @property
    def digest(self) -> str:
        """The original weights' digest and the file's types: what these weights are made of."""
        import hashlib

        kinds = ",".join(f"{k}={v}" for k, v in sorted(self.types.items()))
        return hashlib.sha256(f"{self.model.weights.digest}|{kinds}".encode()).hexdigest()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.model.weights.shape(name))

    def numpy(self, name: str, dtype: DTypeLike = np.float64) -> np.ndarray:
        return self.array(name).astype(dtype)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` at the file's type, float32, in the Hugging Face layout."""
        from ...modelio.gguf_generic import to_file_layout

        array = self.model.weights.numpy(name, np.float32)
        gname = self.names_map.get(name, "")
        kind = self.types.get(gname, "F32")
        if array.ndim < 2 or kind == "F32":
            return array
        key = _cache_key(self.model, name, kind)
        again = None if key is None else _REQUANTIZED.get(key)
        if again is None:
            stored = requantized(to_file_layout(self.architecture, gname, array), kind)
            if stored is None:
                raise BackendInitializationError(
                    f"cannot reproduce {kind} weights ({name}): neither written here nor quantized by ggml without "
                    "an importance matrix", backend="llamacpp_emulation",
                    hint="validate the file itself (--model-path FILE.gguf), whose weights are read as stored")
            again = np.ascontiguousarray(to_file_layout(self.architecture, gname, stored))
            if key is not None:
                _REQUANTIZED[key] = again
        return again.copy()


class LlamaEagerEmulationBackend(EagerReferenceBackend):
    """A generic-tier model's own eager code in float32 at llama.cpp's precision (see the module)."""

    supported_dtypes = ("float32",)
    default_dtype = "float32"
    #: in-process torch on the CPU: its decode may run ahead in a forked child (Capabilities.decode_ahead)
    decode_ahead = True

    def __init__(self, precision: GenericLlamaPrecision | None = None) -> None:
        super().__init__()
        if precision is None:
            raise BackendInitializationError("llamacpp_emulation is built by the llamacpp engine for one file",
                                             backend="llamacpp_emulation", hint="run --alternative-backend llamacpp")
        self.name = "llamacpp_emulation"
        self.precision = precision
        self._names: dict[str, str] = {}
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def version_info(self) -> JsonObject:
        info: JsonObject = {**super().version_info(), "emulates": self.precision.describe()}
        if self.module is not None:
            limits = emulation_limits(self.module, self._names, self.precision)
            if limits:
                info["not_reproduced"] = limits  # type: ignore[assignment]
        return info

    def _gguf_names(self, model: LoadedModel) -> dict[str, str]:
        return generic_gguf_names(model, self.precision.architecture)

    def _at_file_types(self, model: LoadedModel) -> LoadedModel:
        """``model`` with the weights llama.cpp holds: a GGUF's own as they are, a Hugging Face
        model's re-quantized to the file's types (:class:`_Requantized`)."""
        if getattr(model, "format", None) == "gguf":
            return model
        weights = _Requantized(model, self._names, self.precision.tensor_types, self.precision.architecture)
        return dataclasses.replace(model, weights=weights)  # type: ignore[arg-type]

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._names = self._gguf_names(model)
        super().prepare(self._at_file_types(model), dtype, device)
        self._round_like_llama()

    def _type_of(self, hf_name: str) -> str:
        return _type_of(self._names, self.precision, hf_name)

    def _round_like_llama(self) -> None:
        """Hooks and the attention function that round what llama.cpp's kernels round."""
        net = self.module
        assert net is not None
        for name, module in net.named_modules():
            cls = type(module).__name__
            weight = getattr(module, "weight", None)
            if cls in _MATMUL_MODULES and weight is not None and getattr(weight, "ndim", 0) == 2:
                kind = self._type_of(f"{name}.weight")
                if VEC_DOT.get(kind, ("F32",))[0] != "F32":
                    self._hooks.append(module.register_forward_pre_hook(_input_rounding(input_rounding(kind))))
            elif cls in _TANH_GELU_MODULES:
                self._hooks.append(module.register_forward_hook(_gelu_table))
        _register_attention()
        queries, cache_k, cache_v = cache_roundings(self.precision.cache_type_k, self.precision.cache_type_v)
        round_q = queries if queries is not None else (lambda x: x)
        for module in net.modules():  # the modules that dispatch attention through transformers' registry
            if hasattr(module, "scaling") and hasattr(getattr(module, "config", None), "_attn_implementation"):
                _CACHE_ROUNDING[module] = (round_q, cache_k, cache_v)
        net.set_attn_implementation(CACHE_ROUNDED_ATTENTION)


def generic_gguf_names(model: LoadedModel, architecture: str) -> dict[str, str]:
    """Hugging Face parameter name -> the tensor name in an ``architecture`` file, for ``model``."""
    from ...modelio.generic import build_skeleton
    from ...modelio.gguf_generic import gguf_names_of

    net = build_skeleton(model.raw_config, meta=True, source=str(model.path))
    return gguf_names_of(net, architecture, model.num_layers)


def _type_of(names: dict[str, str], precision: LlamaPrecision, hf_name: str) -> str:
    """The file's type of the weight Hugging Face calls ``hf_name`` (the LM head: ``output.weight``,
    else the token embeddings it is tied to)."""
    types = precision.tensor_types
    gname = names.get(hf_name, "")
    if gname == "output.weight" and gname not in types:
        gname = "token_embd.weight"
    return types.get(gname, "F32")


def emulation_limits(net: torch.nn.Module, names: dict[str, str], precision: LlamaPrecision) -> list[str]:
    """What :class:`LlamaEagerEmulationBackend` cannot reproduce of ``precision`` in ``net`` (a
    ``transformers`` model, real or on the ``meta`` device), in words: a quantized weight used outside
    an ``nn.Linear`` / ``Conv1D`` (stacked experts: its input is not rounded), attention that does not
    go through transformers' attention registry (keys and values not rounded to the KV cache type)."""
    limits: list[str] = []
    hooked = {f"{n}.weight" for n, m in net.named_modules() if type(m).__name__ in _MATMUL_MODULES}
    embedded = {f"{n}.weight" for n, m in net.named_modules() if type(m).__name__ == "Embedding"}
    loose = [n for n, p in net.named_parameters() if p.ndim >= 2 and n not in hooked | embedded
             and VEC_DOT.get(_type_of(names, precision, n), ("F32",))[0] != "F32"]
    if loose:
        limits.append(f"the inputs of {len(loose)} quantized weights used outside a Linear module ({loose[0]} ...) "
                      "are not rounded as ggml's kernel rounds them")
    types = precision.tensor_types
    head, embd = types.get("output.weight"), types.get("token_embd.weight")
    if head is not None and embd is not None and head != embd and "lm_head.weight" in tied_names(net):
        limits.append(f"the LM head is the model's embeddings (tied), at the file's {embd}; llama.cpp multiplies by "
                      f"output.weight, stored at {head}")
    if precision.cache_type_k.upper() != "F32" or precision.cache_type_v.upper() != "F32":
        bypass = sorted({type(m).__name__ for m in net.modules() if type(m).__name__.endswith("Attention")
                         and "ALL_ATTENTION_FUNCTIONS" not in vars(sys.modules[type(m).__module__])})
        if bypass:
            limits.append(f"keys and values are not rounded to the {precision.cache_type_k}/{precision.cache_type_v} "
                          f"KV cache: {', '.join(bypass)} does not call transformers' attention registry")
    return limits


def _input_rounding(fn: Rounding) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """A forward pre-hook rounding a module's first input with ``fn``."""
    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (fn(args[0]), *args[1:]) if args else args
    return hook


def _gelu_table(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    """A forward hook: the activation's output as ggml's float16 GELU table gives it."""
    return gelu_fp16_table(args[0])
