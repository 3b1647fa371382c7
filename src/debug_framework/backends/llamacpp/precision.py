"""The precision llama.cpp computes a GGUF at, and a trusted implementation that reproduces it.

llama.cpp's CPU kernels multiply a weight of type T by activations converted to T's
``vec_dot_type``: F16 weights by F16 activations, Q4_0/Q5_0/Q8_0 by Q8_0 blocks of 32, Q4_1/Q5_1 by
Q8_1 (the same rounding), K-quants by Q8_K blocks of 256 (:func:`quantize_q8_k`, a float32 scale);
keys and values are stored in the KV cache at its type (F16 by default) and the queries meet F16
keys as F16. :class:`LlamaPrecision` says so for one file and one set of settings;
:class:`LlamaEmulationBackend` (what the calibration runs at ``--dtype auto``, and the precision
diagnosis under the file's quantization name) is the reference written from the math over torch in
float32 with exactly those roundings: the weights at the file's types (a GGUF's own as stored; a
Hugging Face model's re-quantized by :func:`requantized`: the simple types by a vectorised NumPy
round trip bit-exact with ggml's reference quantizers, the K-quants by ggml's own quantizer; row
blocks, so the converter's q/k row permutation does not change them), every matrix product's input
quantized as the kernel's, keys, values and queries rounded to the cache type, and the tanh GELU
(Gemma) through ggml's float16 table (:func:`gelu_fp16_table`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...errors import BackendInitializationError
from ..torch_reference import TorchReferenceBackend
from .binding import GGML_QUANTIZED

if TYPE_CHECKING:
    import torch

    from ...jsonio import JsonObject
    from ...modelio.gguf_read import GgufFile
    from ...modelio.loader import LoadedModel
    from .graph import LlamaSettings

__all__ = ["LlamaPrecision", "llama_precision", "LlamaEmulationBackend", "VEC_DOT", "quantize_activations",
           "quantize_q8_k", "requantized", "gelu_fp16_table", "input_rounding", "cache_roundings"]

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
                                               "ffn_act": ("ffn_down",), "attn": ("attn_output",),
                                               # a mixture of experts: the router, and ggml's mul_mat_id of
                                               # the stacked experts (its input converted as mul_mat's)
                                               "router_in": ("ffn_gate_inp",),
                                               "experts_in": ("ffn_gate_exps", "ffn_up_exps"),
                                               "experts_act": ("ffn_down_exps",)}


def quantize_activations(x: torch.Tensor, kind: str, block: int, half_scale: bool) -> torch.Tensor:
    """``x`` rounded as ggml converts a matrix product's input: to F16 / BF16, to Q8_K blocks of 256
    (:func:`quantize_q8_k`), or to Q8_0/Q8_1 blocks of ``block`` along the last axis (``d = max|x| / 127``,
    ``q = round(x * 127 / max|x|)``, ``d`` kept in float16 where ``half_scale``); returned dequantized,
    in ``x``'s dtype."""
    import torch

    if kind == "F32":
        return x
    if kind in ("F16", "BF16"):
        return x.to(torch.float16 if kind == "F16" else torch.bfloat16).to(x.dtype)
    if kind == "Q8_K":
        return quantize_q8_k(x)
    shape = x.shape
    if shape[-1] % block:
        return x
    xb = x.reshape(*shape[:-1], shape[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(amax > 0, _divided(127.0, amax), torch.zeros_like(amax))
    q = torch.round(xb * inv).clamp(-127, 127)
    if half_scale:
        d = d.to(torch.float16).to(x.dtype)
    return (q * d).reshape(shape)



def input_rounding(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """What a matrix product with a ``kind`` weight does to its input (:data:`VEC_DOT`)."""
    act, block, half = VEC_DOT.get(kind, ("F32", 0, False))
    return lambda x: quantize_activations(x, act, block, half)


def cache_roundings(cache_type_k: str, cache_type_v: str
                    ) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, Callable[[torch.Tensor], torch.Tensor],
                               Callable[[torch.Tensor], torch.Tensor]]:
    """What llama.cpp's KV cache of those types does to the queries (None: nothing; F16/BF16 keys
    meet queries of their type), the keys and the values stored in it and read back."""
    def stored(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
        upper = kind.upper()
        act, block, half = ("F32", 0, False) if upper == "F32" else (upper, 0, False) if upper in ("F16", "BF16") \
            else ("Q8_0", 32, True)
        return lambda x: quantize_activations(x, act, block, half)
    keys = stored(cache_type_k)
    return (keys if cache_type_k.upper() in ("F16", "BF16") else None), keys, stored(cache_type_v)


def _divided(numerator: float, t: torch.Tensor) -> torch.Tensor:
    """``numerator / t`` correctly rounded, as C divides (torch computes ``scalar / tensor`` as a
    reciprocal times the scalar: two roundings); where ``t`` is 0 the result is not used."""
    import torch

    safe = torch.where(t != 0, t, torch.ones_like(t))
    return torch.full_like(t, numerator) / safe


def quantize_q8_k(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ggml's ``quantize_row_q8_K_ref`` converts a K-quant dot product's input, read back:
    blocks of 256 along the last axis, in float32; ``max`` the block's value of largest magnitude
    (signed), ``iscale = -127 / max``, ``q = min(127, nearest_int(iscale * x))`` (halves to even),
    ``d = 1 / iscale`` kept in float32 (not float16, unlike Q8_0), value ``q * d``; an all-zero block
    stays zero. The sign of ``max`` cancels exactly (``iscale * x`` and ``1 / iscale`` only change
    sign), so this computes ``round(x * (127 / max|x|)) * (1 / (127 / max|x|))``. Rows that are not
    whole blocks are returned as they are (ggml's K-quant files have none)."""
    import torch

    shape = x.shape
    if shape[-1] % 256:
        return x
    xb = x.to(torch.float32).reshape(*shape[:-1], shape[-1] // 256, 256)
    amax = xb.abs().amax(-1, keepdim=True)
    nonzero = amax > 0
    iscale = torch.where(nonzero, _divided(127.0, amax), torch.zeros_like(amax))
    q = torch.round(xb * iscale).clamp(max=127)
    d = torch.where(nonzero, _divided(1.0, iscale), torch.zeros_like(iscale))
    return (q * d).reshape(shape).to(x.dtype)


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


#: values round-tripped at a time: whole tensors in few NumPy passes over chunks that stay in the
#: CPU's cache (256 KiB of float32; measured fastest of 64 KiB to 4 MiB), with no Python per block
_CHUNK_VALUES = 1 << 16


#: the float32 just below 0.5: ``trunc(x + copysign(it, x))`` is C's ``roundf`` (halves away from
#: zero, as ggml's reference quantizers round) exactly in float32, checked on every float32 of
#: magnitude 0.25 to 130 (``x + 0.5`` would carry 0.49999997 up to 1)
_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0))


def _half(x: np.ndarray) -> np.ndarray:
    """A block scale as the file stores it: rounded to float16."""
    return x.astype(np.float16).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    """``1 / d``, 0 where ``d`` is 0 (ggml's ``id = d ? 1.0f/d : 0.0f``)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d)


def _signed_max(b: np.ndarray) -> np.ndarray:
    """Each block's value of largest magnitude, with its sign (the first such, as ggml takes it)."""
    return np.take_along_axis(b, np.abs(b).argmax(axis=-1)[:, None], axis=-1)


def _symmetric(b: np.ndarray, levels: int) -> np.ndarray:
    """Q4_0 (``levels`` 16) and Q5_0 (32): ``d = max / -(levels/2)``,
    ``q = min(levels-1, (int)(x/d + levels/2 + 0.5))``, stored ``d`` float16, read back ``(q - levels/2) * d``."""
    half_levels = np.float32(levels // 2)
    d = _signed_max(b) / -half_levels
    q = np.clip(np.trunc(b * _inverse(d) + (half_levels + np.float32(0.5))), 0, levels - 1)
    return _half(d) * (q - half_levels)


def _affine(b: np.ndarray, levels: int) -> np.ndarray:
    """Q4_1 (``levels`` 16) and Q5_1 (32): ``d = (max - min) / (levels-1)``, ``q = (int)((x - min)/d + 0.5)``,
    stored ``d`` and ``min`` float16, read back ``d * q + min``."""
    hi, lo = b.max(axis=-1, keepdims=True), b.min(axis=-1, keepdims=True)
    d = (hi - lo) / np.float32(levels - 1)
    q = np.clip(np.trunc((b - lo) * _inverse(d) + np.float32(0.5)), 0, levels - 1)
    return _half(d) * q + _half(lo)


def _absmax(b: np.ndarray) -> np.ndarray:
    """Each block's largest magnitude ``[blocks, 1]``, by halving the block (a power of two long):
    NumPy's reduction along a short last axis is several times slower."""
    a = np.abs(b)
    while a.shape[-1] > 1 and a.shape[-1] % 2 == 0:
        half = a.shape[-1] // 2
        a = np.maximum(a[:, :half], a[:, half:])
    return a.max(axis=-1, keepdims=True)


def _q8_0(b: np.ndarray) -> np.ndarray:
    """Q8_0: ``d = max|x| / 127``, ``q = roundf(x * (1 / d))``, stored ``d`` float16, read back ``q * d``."""
    d = _absmax(b) / np.float32(127)
    y = b * _inverse(d)
    y += np.copysign(_BELOW_HALF, y)  # roundf, in place: trunc(y + copysign(0.49999997, y))
    np.trunc(y, out=y)
    y *= _half(d)
    return y


def _bf16(x: np.ndarray) -> np.ndarray:
    """ggml's float32 -> bfloat16 (round to nearest even; NaN kept quiet), read back as float32."""
    n = x.view(np.uint32).astype(np.uint64)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, (n & 0xFFFF0000) | (64 << 16), n)
    n = ((n + (0x7FFF + ((n >> 16) & 1))) >> 16) << 16
    return n.astype(np.uint32).view(np.float32)


#: the weight types whose round trip is written here in NumPy (bit-exact with ggml's reference
#: quantizers and the ``gguf`` package): type -> (block length, the round trip of ``[blocks, block]``)
_ROUND_TRIPS: dict[str, tuple[int, Callable[[np.ndarray], np.ndarray]]] = {
    "F16": (1, lambda b: b.astype(np.float16).astype(np.float32)), "BF16": (1, _bf16),
    "Q8_0": (32, _q8_0), "Q4_0": (32, lambda b: _symmetric(b, 16)), "Q5_0": (32, lambda b: _symmetric(b, 32)),
    "Q4_1": (32, lambda b: _affine(b, 16)), "Q5_1": (32, lambda b: _affine(b, 32)),
}

def requantized(weights: np.ndarray, kind: str) -> np.ndarray | None:
    """``weights`` (float32, rows on the last axis) as a file of type ``kind`` stores them, read back
    as float32: whole tensors in chunks of rows, no Python per block. None for a type neither
    written here nor quantized by ggml without an importance matrix, or rows that are not whole
    blocks of it (no file stores such a tensor at that type)."""
    x = np.ascontiguousarray(weights, dtype=np.float32)
    if kind == "F32":
        return x
    if kind in GGML_QUANTIZED:  # through ggml's own quantizer, as llama-quantize without an importance matrix
        return _through_ggml(x, kind)
    if kind not in _ROUND_TRIPS:
        return None
    block, trip = _ROUND_TRIPS[kind]
    if x.shape[-1] % block:
        return None
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    step = max(block, _CHUNK_VALUES // block * block)
    for start in range(0, flat.size, step):
        chunk = flat[start:start + step]
        out[start:start + step] = trip(chunk.reshape(-1, block)).reshape(-1)
    return out.reshape(x.shape)


def _through_ggml(x: np.ndarray, kind: str) -> np.ndarray | None:
    """``x`` quantized by ggml's quantizer and dequantized by the ``gguf`` package, rows at a time."""
    import gguf

    from .binding import QK_K, ggml_quantize_rows, library

    block = 32 if kind == "IQ4_NL" else QK_K
    if x.ndim < 1 or x.shape[-1] % block:
        return None
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    lib, qtype = library(), gguf.GGMLQuantizationType[kind]
    step = max(1, _CHUNK_VALUES // rows.shape[1])
    for start in range(0, rows.shape[0], step):
        stored = ggml_quantize_rows(lib, rows[start:start + step], kind)
        out[start:start + step] = np.asarray(gguf.quants.dequantize(stored, qtype), np.float32)
    return out.reshape(x.shape)


#: (weights file, its size and time, tensor, type) -> the tensor re-quantized, while an emulation holds
#: it (weak values: the calibration's, the precision diagnosis's and the drill-down's emulations of one
#: session share one copy, quantized once; nothing is kept once no emulation holds it)
_REQUANTIZED: weakref.WeakValueDictionary[tuple[str, int, int, str, str], np.ndarray] = weakref.WeakValueDictionary()


def _cache_key(model: LoadedModel, name: str, kind: str) -> tuple[str, int, int, str, str] | None:
    """What identifies tensor ``name`` of ``model`` at ``kind`` in :data:`_REQUANTIZED`: its file (path,
    size, modification time) for a loaded store (a fork shares its files); None for any other mapping
    (the noise rule's perturbed weights, never cached)."""
    from ...modelio.weights import WeightStore

    weights = model.weights
    if not isinstance(weights, WeightStore):
        return None
    path = weights.file_of(name)
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns, name, kind)


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
    #: in-process torch on the CPU: its decode may run ahead in a forked child (Capabilities.decode_ahead)
    decode_ahead = True

    def __init__(self, precision: LlamaPrecision | None = None) -> None:
        super().__init__()
        if precision is None:
            raise BackendInitializationError("llamacpp_emulation is built by the llamacpp engine for one file",
                                             backend=self.name, hint="run --alternative-backend llamacpp")
        self.precision = precision

    def version_info(self) -> JsonObject:
        return {**super().version_info(), "emulates": self.precision.describe()}

    def _weights(self, model: LoadedModel) -> dict[str, np.ndarray]:
        """The model's weights as llama.cpp holds them: a GGUF's own as stored (read dequantized: they
        are the file's values already), a Hugging Face model's re-quantized to the file's types
        (:func:`requantized`), each tensor once per loaded model (:data:`_REQUANTIZED`)."""
        from ...modelio.gguf_model import gguf_name

        own_file = getattr(model, "format", None) == "gguf"
        out: dict[str, np.ndarray] = {}
        for name in model.weights:
            array = model.weights.numpy(name, np.float32)
            kind = self.precision.tensor_types.get(gguf_name(name) or "", "F32")
            if own_file or array.ndim < 2 or kind == "F32":
                out[name] = array
                continue
            key = _cache_key(model, name, kind)
            again = None if key is None else _REQUANTIZED.get(key)
            if again is None:
                again = requantized(array, kind)
                if again is None:
                    raise BackendInitializationError(
                        f"cannot reproduce {kind} weights ({name}): neither written here nor quantized by ggml "
                        "without an importance matrix", backend=self.name,
                        hint="validate the file itself (--model-path FILE.gguf), whose weights are read as stored")
                if key is not None:
                    _REQUANTIZED[key] = again
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
        return input_rounding(self.precision.tensor_types.get(tensor, "F32"))

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

    def _round_like_llama(self) -> None:
        """The model's taps round what llama.cpp's kernels round (the instance's own ``tap`` and head)."""
        net = self.net
        assert net is not None
        rounding: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            tap: self._activation(self._first_tensor(tensor)) for tap, tensor in _TAPPED_INPUTS.items()}
        self._round_block_inputs(rounding["attn_norm"], rounding["ffn_norm"])
        queries, cache_k, cache_v = cache_roundings(self.precision.cache_type_k, self.precision.cache_type_v)
        rounding["k_rope"], rounding["v"] = cache_k, cache_v
        if queries is not None:
            rounding["q_rope"] = queries  # queries meet F16 keys as F16
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
