"""The precision llama.cpp computes a GGUF at, and a trusted implementation that reproduces it.

llama.cpp's CPU kernels multiply a weight of type T by activations converted to T's
``vec_dot_type``: F16 weights by F16 activations, Q4_0/Q5_0/Q8_0 by Q8_0 blocks of 32, Q4_1/Q5_1 by
Q8_1 (the same rounding), K-quants by Q8_K blocks of 256; keys and values are stored in the KV cache
at its type (F16 by default) and the queries meet F16 keys as F16. :class:`LlamaPrecision` says so
for one file and one set of settings; :class:`LlamaEmulationBackend` (what the calibration runs at
``--dtype auto``, and the precision diagnosis under the file's quantization name) is the reference
written from the math over torch in float32 with exactly those roundings: the weights quantized to
the file's types (the Hugging Face model's weights re-quantized with the ``gguf`` package's kernels,
row blocks, so the converter's q/k row permutation does not change them), every matrix product's
input quantized as the kernel's, keys, values and queries rounded to the cache type, and the
tanh GELU (Gemma) through ggml's float16 table (:func:`gelu_fp16_table`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...errors import BackendInitializationError
from ..torch_reference import TorchReferenceBackend

if TYPE_CHECKING:
    import torch

    from ...jsonio import JsonObject
    from ...modelio.gguf_read import GgufFile
    from ...modelio.loader import LoadedModel
    from .graph import LlamaSettings

__all__ = ["LlamaPrecision", "llama_precision", "LlamaEmulationBackend", "VEC_DOT", "quantize_activations",
           "gelu_fp16_table"]

#: weight type -> (activation type, block size, scale stored as float16) of ggml's CPU dot products
VEC_DOT: dict[str, tuple[str, int, bool]] = {
    "F32": ("F32", 0, False), "F16": ("F16", 0, False), "BF16": ("BF16", 0, False),
    "Q4_0": ("Q8_0", 32, True), "Q5_0": ("Q8_0", 32, True), "Q8_0": ("Q8_0", 32, True), "IQ4_NL": ("Q8_0", 32, True),
    "Q4_1": ("Q8_1", 32, True), "Q5_1": ("Q8_1", 32, True),
    **{k: ("Q8_K", 256, False) for k in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                          "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")},
}

#: which tensor's type decides the rounding of each value the reference taps (``Model.tap`` names)
_TAPPED_INPUTS: dict[str, tuple[str, ...]] = {"attn_norm": ("attn_q", "attn_qkv"), "ffn_norm": ("ffn_gate", "ffn_up"),
                                               "ffn_act": ("ffn_down",), "attn": ("attn_output",)}


def quantize_activations(x: torch.Tensor, kind: str, block: int, half_scale: bool) -> torch.Tensor:
    """``x`` rounded as ggml converts a matrix product's input: to F16 / BF16, or to Q8 blocks of
    ``block`` along the last axis (``d = max|x| / 127``, ``q = round(x / d)``, ``d`` kept in float16
    where ``half_scale``); returned dequantized, in ``x``'s dtype."""
    import torch

    if kind == "F32":
        return x
    if kind in ("F16", "BF16"):
        return x.to(torch.float16 if kind == "F16" else torch.bfloat16).to(x.dtype)
    shape = x.shape
    if shape[-1] % block:
        return x
    xb = x.reshape(*shape[:-1], shape[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.zeros_like(amax))
    q = torch.round(xb * inv).clamp(-127, 127)
    if half_scale:
        d = d.to(torch.float16).to(x.dtype)
    return (q * d).reshape(shape)


@dataclass(frozen=True)
class LlamaPrecision:
    """What llama.cpp computes one file at: each tensor's stored type, the KV cache's types and
    flash attention. ``name`` is the file's quantization (``q8_0``; ``f32``), what ``consistent_with``
    says of a run that errs exactly as this precision does."""

    name: str
    tensor_types: dict[str, str]
    cache_type_k: str
    cache_type_v: str
    flash_attn: str
    #: the float dtype the emulation computes in (activations stay float32 in ggml)
    dtype: str = "float32"
    settings_note: str = field(default="", compare=False)

    def describe(self) -> str:
        """One line: ``Q8_0 weights (activations as Q8_0 blocks), KV cache f16/f16, flash attention auto``."""
        counts: dict[str, int] = {}
        for t in self.tensor_types.values():
            counts[t] = counts.get(t, 0) + 1
        weights = ", ".join(f"{t} ({VEC_DOT.get(t, (t,))[0]} activations)" if VEC_DOT.get(t, ("F32",))[0] != "F32"
                            else t for t in sorted(counts, key=lambda k: -counts[k]))
        return (f"{weights} weights, KV cache {self.cache_type_k}/{self.cache_type_v}, flash attention "
                f"{self.flash_attn}")

    def trusted_backend(self) -> LlamaEmulationBackend:
        """The trusted implementation of this precision (for the calibration and the precision diagnosis)."""
        return LlamaEmulationBackend(self)


#: float types -> the framework's dtype name (what a float file's or cache's rounding is called)
_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _main_type(types: dict[str, str]) -> str:
    """The type most of the file's 2-D weights are stored in (by count of tensors)."""
    counts: dict[str, int] = {}
    for name, t in types.items():
        if name.endswith("weight") and "norm" not in name:
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else "F32"


def _name(main: str, cache_k: str, cache_v: str) -> str:
    """What ``consistent_with`` calls the precision: a quantized file's type (``q8_0``); for a float
    file the least precise float among its weights and KV cache (``float16`` for an f32 file with
    llama.cpp's default F16 cache), or the cache's quantization where that is one."""
    if main not in _FLOATS:
        return main.lower()
    kinds = [main, cache_k.upper(), cache_v.upper()]
    quantized = [k for k in kinds if k not in _FLOATS]
    if quantized:
        return quantized[0].lower()
    order = ["float32", "float16", "bfloat16"]
    return max((_FLOATS[k] for k in kinds), key=order.index)


def llama_precision(gguf: GgufFile, settings: LlamaSettings) -> LlamaPrecision:
    """The precision llama.cpp runs ``gguf`` at with ``settings``."""
    types = gguf.tensor_types()
    name = _name(_main_type(types), settings.cache_type_k, settings.cache_type_v)
    return LlamaPrecision(name, types, settings.cache_type_k, settings.cache_type_v, settings.flash_attn)


def _requantized(weights: np.ndarray, kind: str) -> np.ndarray | None:
    """``weights`` as a file of type ``kind`` stores them (dequantized float32); None where the
    ``gguf`` package cannot quantize that type."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if qtype == gguf.GGMLQuantizationType.F32:
        return weights.astype(np.float32)
    try:
        stored = gguf.quants.quantize(np.ascontiguousarray(weights, np.float32), qtype)
        return np.asarray(gguf.quants.dequantize(stored, qtype), np.float32).reshape(weights.shape)
    except (NotImplementedError, gguf.quants.QuantError, ValueError):
        return None


def gelu_fp16_table(x: torch.Tensor) -> torch.Tensor:
    """ggml's CPU GELU (tanh form) as it computes it: through a table indexed by the input rounded
    to float16 and holding float16 values (``ggml_table_gelu_f16``); 0 at or below -10, ``x`` at or
    above 10."""
    import torch

    half = x.to(torch.float16).to(torch.float32)
    y = torch.nn.functional.gelu(half, approximate="tanh").to(torch.float16).to(x.dtype)
    return torch.where(x <= -10.0, torch.zeros_like(x), torch.where(x >= 10.0, x, y))


class LlamaEmulationBackend(TorchReferenceBackend):
    """The reference models over torch in float32 at llama.cpp's precision (see the module)."""

    name = "llamacpp_emulation"
    supported_dtypes = ("float32",)

    def __init__(self, precision: LlamaPrecision | None = None) -> None:
        super().__init__()
        if precision is None:
            raise BackendInitializationError("llamacpp_emulation is built by the llamacpp engine for one file",
                                             backend=self.name, hint="run --alternative-backend llamacpp")
        self.precision = precision

    def version_info(self) -> JsonObject:
        return {**super().version_info(), "emulates": self.precision.describe()}

    def _weights(self, model: LoadedModel) -> dict[str, np.ndarray]:
        from ...modelio.gguf_model import gguf_name

        out: dict[str, np.ndarray] = {}
        for name in model.weights:
            array = model.weights.numpy(name, np.float32)
            kind = self.precision.tensor_types.get(gguf_name(name) or "", "F32")
            if array.ndim < 2 or kind == "F32":
                out[name] = array
                continue
            again = _requantized(array, kind)
            if again is None:
                if getattr(model, "format", None) != "gguf":
                    raise BackendInitializationError(
                        f"cannot reproduce {kind} weights ({name}): the gguf package does not quantize {kind}",
                        backend=self.name, hint="validate the file itself (--model-path FILE.gguf), whose weights are "
                                                "read as stored")
                again = array  # the file's own weights, read as stored
            out[name] = again
        return out

    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str = "cpu") -> None:
        from ...architectures import build_reference
        from ...architectures.xp import torch_namespace
        from ...backends.base import no_reference_from_math

        dtype = self._check_prepare(model, dtype, "cpu")
        no_reference_from_math(model)
        self._graph = None
        self.net = build_reference(model.config, self._weights(model), dtype, torch_namespace(), stream=False)
        self._round_like_llama()

    def _activation(self, tensor: str) -> Callable[[torch.Tensor], torch.Tensor]:
        kind = self.precision.tensor_types.get(tensor, "F32")
        act, block, half = VEC_DOT.get(kind, ("F32", 0, False))
        return lambda x: quantize_activations(x, act, block, half)

    def _round_block_inputs(self, attention_in: Callable[[torch.Tensor], torch.Tensor],
                            mlp_in: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The projections' input of a family whose blocks tap no ``attn_norm`` / ``ffn_norm`` (Gemma)
        or whose fused projections have another name (Phi-3): rounded where the block takes it
        (rounding twice is rounding once)."""
        net = self.net
        assert net is not None
        attention = net.attention
        mlp = getattr(net, "mlp", None)

        def rounded_attention(i: int, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return attention(i, attention_in(x), attention_mask)

        net.attention = rounded_attention  # type: ignore[method-assign]
        if mlp is not None:
            def rounded_mlp(i: int, x: torch.Tensor) -> torch.Tensor:
                return mlp(i, mlp_in(x))

            net.mlp = rounded_mlp  # type: ignore[attr-defined]

    def _first_tensor(self, tensors: tuple[str, ...]) -> str:
        """The first of layer 0's ``tensors`` the file has (``attn_q``, else Phi-3's fused ``attn_qkv``)."""
        names = [f"blk.0.{t}.weight" for t in tensors]
        return next((n for n in names if n in self.precision.tensor_types), names[0])

    def _cache(self, kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
        upper = kind.upper()
        act, block, half = ("F32", 0, False) if upper == "F32" else (upper, 0, False) if upper in ("F16", "BF16") \
            else ("Q8_0", 32, True)
        return lambda x: quantize_activations(x, act, block, half)

    def _round_like_llama(self) -> None:
        """The model's taps round what llama.cpp's kernels round (the instance's own ``tap`` and head)."""
        net = self.net
        assert net is not None
        rounding: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            tap: self._activation(self._first_tensor(tensor)) for tap, tensor in _TAPPED_INPUTS.items()}
        self._round_block_inputs(rounding["attn_norm"], rounding["ffn_norm"])
        cache_k, cache_v = self._cache(self.precision.cache_type_k), self._cache(self.precision.cache_type_v)
        rounding["k_rope"], rounding["v"] = cache_k, cache_v
        if self.precision.cache_type_k.upper() in ("F16", "BF16"):
            rounding["q_rope"] = cache_k  # queries meet F16 keys as F16
        traced = net.tap
        table_gelu = net.config.hidden_act in ("gelu_pytorch_tanh", "gelu_new")
        seen: dict[str, torch.Tensor] = {}

        def tap(name: str, value: torch.Tensor) -> torch.Tensor:
            if table_gelu and name in ("ffn_gate", "ffn_up"):
                seen[name] = value
            elif table_gelu and name == "ffn_act":
                value = gelu_fp16_table(seen.pop("ffn_gate")) * seen.pop("ffn_up")
            value = traced(name, value)
            fn = rounding.get(name)
            return fn(value) if fn is not None else value

        cached = net.cached

        def cache(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # what enters the KV cache is stored at its type, whichever step the family taps
            return cached(i, cache_k(k), cache_v(v))

        net.cached = cache  # type: ignore[method-assign]
        head_types = self.precision.tensor_types
        head = self._activation("output.weight" if "output.weight" in head_types else "token_embd.weight")
        project = net.params.project
        net.tap = tap  # type: ignore[method-assign]
        net.params.project = lambda param, x: project(param, head(x))  # type: ignore[method-assign]
