"""A ctypes binding to the llama.cpp C API inside the ``xllamacpp`` wheel's shared object.

``xllamacpp``'s Python API has no eval callback, but its ``xllamacpp.abi3.so`` exports the whole
``llama.h`` / ``ggml`` C API. This module binds the few functions the engine uses and the two
parameter structs, laid out as in the llama.cpp compiled into :data:`PINNED_XLLAMACPP`.

The layout is checked at run time before any struct is passed by value: ``llama_context_default_params``
and ``llama_model_default_params`` are called into an oversized buffer (x86-64: through the hidden
return pointer, into a sentinel-filled buffer, so the size written is seen too) and every default
this layout expects (``n_ctx`` 512, ``n_batch`` 2048, F16 KV cache, flash attention auto ...) must
be where it is read. Any difference is :class:`~debug_framework.errors.BackendInitializationError`
(DF002) naming the field, never a crash.

llama.cpp's own log goes through ``llama_log_set`` into :data:`LOG` (kept, never printed).
"""

from __future__ import annotations

import ctypes
import platform
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import BackendInitializationError

__all__ = ["PINNED_XLLAMACPP", "GGML_TYPES", "ModelParams", "ContextParams", "Batch", "EvalCallback",
           "Library", "library", "library_path", "LOG", "ggml_tensor_name", "ggml_tensor_shape", "ggml_tensor_type",
           "ggml_tensor_array", "ggml_tensor_write", "ggml_quantize_rows", "ggml_quantize_row_q8_k", "QK_K", "GGML_QUANTIZED"]

#: the xllamacpp version whose llama.cpp this layout matches (``pip install xllamacpp==...``)
PINNED_XLLAMACPP = "2026.10.11549"

#: GGML type names -> ids (the KV cache types a user may set, and what the file stores)
GGML_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

#: llama.cpp's log lines of this process (the latest 2000): shown in an error, never on the terminal
LOG: deque[str] = deque(maxlen=2000)

#: ``bool cb_eval(struct ggml_tensor * t, bool ask, void * user_data)``
EvalCallback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
_LogCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

_u32, _i32, _f32, _ptr, _bool = ctypes.c_uint32, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p, ctypes.c_bool


class ModelParams(ctypes.Structure):
    """``struct llama_model_params`` (78 bytes of fields, 80 with padding)."""

    _fields_ = [("devices", _ptr), ("tensor_buft_overrides", _ptr), ("n_gpu_layers", _i32), ("split_mode", _i32),
                ("load_mode", _i32), ("lazy_mode", _i32), ("main_gpu", _i32), ("tensor_split", _ptr),
                ("progress_callback", _ptr), ("progress_callback_user_data", _ptr), ("kv_overrides", _ptr),
                ("vocab_only", _bool), ("check_tensors", _bool), ("use_extra_bufts", _bool), ("no_host", _bool),
                ("no_alloc", _bool), ("load_mtp", _bool)]


class ContextParams(ctypes.Structure):
    """``struct llama_context_params`` (168 bytes). ``reserved_128`` is a pointer-sized field of this
    build between ``abort_callback_data`` and the booleans (zero by default; never set here)."""

    _fields_ = [*((n, _u32) for n in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq", "n_outputs_max",
                                      "n_outputs_max_per_seq")),
                *((n, _i32) for n in ("n_threads", "n_threads_batch", "ctx_type", "rope_scaling_type",
                                      "pooling_type", "attention_type", "flash_attn_type")),
                *((n, _f32) for n in ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
                                      "yarn_beta_fast", "yarn_beta_slow")),
                ("yarn_orig_ctx", _u32), ("defrag_thold", _f32), ("cb_eval", EvalCallback),
                ("cb_eval_user_data", _ptr), ("type_k", _i32), ("type_v", _i32), ("abort_callback", _ptr),
                ("abort_callback_data", _ptr), ("reserved_128", _ptr),
                *((n, _bool) for n in ("embeddings", "offload_kqv", "no_perf", "op_offload", "swa_full",
                                       "kv_unified")),
                ("samplers", _ptr), ("n_samplers", ctypes.c_size_t), ("ctx_other", _ptr)]


class Batch(ctypes.Structure):
    """``struct llama_batch``."""

    _fields_ = [("n_tokens", _i32), ("token", ctypes.POINTER(_i32)), ("embd", ctypes.POINTER(_f32)),
                ("pos", ctypes.POINTER(_i32)), ("n_seq_id", ctypes.POINTER(_i32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(_i32))), ("logits", ctypes.POINTER(ctypes.c_int8))]


#: (struct, field, expected default) checked against the library's own defaults
_EXPECTED: tuple[tuple[str, str, object], ...] = (
    ("context", "n_ctx", 512), ("context", "n_batch", 2048), ("context", "n_ubatch", 512),
    ("context", "n_seq_max", 1), ("context", "n_threads", 4), ("context", "n_threads_batch", 4),
    ("context", "rope_scaling_type", -1), ("context", "pooling_type", -1), ("context", "attention_type", -1),
    ("context", "flash_attn_type", -1), ("context", "yarn_ext_factor", -1.0), ("context", "defrag_thold", -1.0),
    ("context", "type_k", 1), ("context", "type_v", 1), ("context", "reserved_128", None),
    ("context", "embeddings", False), ("context", "offload_kqv", True), ("context", "no_perf", True),
    ("context", "kv_unified", False), ("context", "samplers", None), ("context", "n_samplers", 0),
    ("context", "ctx_other", None),
    ("model", "n_gpu_layers", -1), ("model", "split_mode", 1), ("model", "load_mode", -1),
    ("model", "vocab_only", False), ("model", "use_extra_bufts", True), ("model", "load_mtp", False),
)

#: the bytes each default-params function writes (x86-64 check), with trailing padding
_SIZES = {"context": (ctypes.sizeof(ContextParams), ctypes.sizeof(ContextParams)),
          "model": (ctypes.sizeof(ModelParams) - 2, ctypes.sizeof(ModelParams))}


def library_path() -> Path:
    """The shared object of the installed ``xllamacpp`` (DF002 where it is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("xllamacpp")
    if spec is None or not spec.submodule_search_locations:
        raise BackendInitializationError(
            "xllamacpp is not installed", backend="llamacpp",
            hint=f"pip install 'xllamacpp=={PINNED_XLLAMACPP}' (or the project's [llamacpp] extra)")
    for location in spec.submodule_search_locations:
        for candidate in sorted(Path(location).glob("xllamacpp*.so")) + sorted(Path(location).glob("xllamacpp*.pyd")):
            return candidate
    raise BackendInitializationError("xllamacpp's shared object is missing from its package", backend="llamacpp",
                                     hint=f"reinstall xllamacpp=={PINNED_XLLAMACPP}")


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xllamacpp")
    except PackageNotFoundError:
        return "unknown"


def _probe(fn: ctypes._CFuncPtr, struct_type: type[ctypes.Structure], which: str) -> ctypes.Structure:  # type: ignore[name-defined]
    """The defaults ``fn`` returns, read without risking an overflow: on x86-64 through the hidden
    return pointer into a sentinel-filled 1 KiB buffer (whose written size is checked), elsewhere as an
    oversized struct returned by value (still in memory, so never truncated)."""
    size = ctypes.sizeof(struct_type)
    buf = (ctypes.c_ubyte * 1024)(*([0xAB] * 1024))
    if platform.machine().lower() in ("x86_64", "amd64") and platform.system() != "Windows":
        raw = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(ctypes.cast(fn, ctypes.c_void_p).value)
        raw(ctypes.addressof(buf))
        data = bytes(buf)
        written = max(i for i in range(1024) if data[i] != 0xAB) + 1
        low, high = _SIZES[which]
        if not low <= written <= high:
            raise BackendInitializationError(
                f"llama.cpp's llama_{which}_params has {written} bytes, this binding's layout {size}: the "
                f"installed xllamacpp {_installed_version()} is not the version this binding was written for",
                backend="llamacpp", hint=f"pip install 'xllamacpp=={PINNED_XLLAMACPP}'")
        return struct_type.from_buffer_copy(data[:size])

    class Oversized(ctypes.Structure):
        _fields_ = [("params", struct_type), ("spare", ctypes.c_ubyte * 512)]

    fn.restype = Oversized
    fn.argtypes = []
    return fn().params  # type: ignore[no-any-return]


def _check_defaults(context: ContextParams, model: ModelParams) -> None:
    structs = {"context": context, "model": model}
    for which, name, expected in _EXPECTED:
        got = getattr(structs[which], name)
        same = abs(got - expected) < 1e-6 if isinstance(expected, float) else got == expected
        if not same:
            raise BackendInitializationError(
                f"llama.cpp's default llama_{which}_params.{name} is {got!r} where this binding's layout expects "
                f"{expected!r}: the installed xllamacpp {_installed_version()} lays the struct out differently",
                backend="llamacpp", hint=f"pip install 'xllamacpp=={PINNED_XLLAMACPP}'")


@dataclass
class Library:
    """The bound shared object and its checked defaults."""

    so: ctypes.CDLL
    path: Path
    default_context: ContextParams
    default_model: ModelParams

    def context_params(self) -> ContextParams:
        """A copy of llama.cpp's default context parameters."""
        return ContextParams.from_buffer_copy(self.default_context)

    def model_params(self) -> ModelParams:
        """A copy of llama.cpp's default model parameters."""
        return ModelParams.from_buffer_copy(self.default_model)


_lock = threading.Lock()
_library: Library | None = None
_log_callback = _LogCallback(lambda level, text, user: LOG.append((text or b"").decode("utf-8", "replace")))


def _declare(so: ctypes.CDLL) -> None:
    """Argument and result types of every function used."""
    sig: dict[str, tuple[list[object], object]] = {
        "llama_backend_init": ([], None),
        "llama_log_set": ([_LogCallback, _ptr], None),
        "llama_model_load_from_file": ([ctypes.c_char_p, ModelParams], _ptr),
        "llama_model_free": ([_ptr], None),
        "llama_init_from_model": ([_ptr, ContextParams], _ptr),
        "llama_free": ([_ptr], None),
        "llama_decode": ([_ptr, Batch], _i32),
        "llama_get_logits": ([_ptr], ctypes.POINTER(_f32)),
        "llama_model_n_embd": ([_ptr], _i32),
        "llama_model_n_layer": ([_ptr], _i32),
        "llama_model_get_vocab": ([_ptr], _ptr),
        "llama_vocab_n_tokens": ([_ptr], _i32),
        "ggml_get_name": ([_ptr], ctypes.c_char_p),
        "ggml_nbytes": ([_ptr], ctypes.c_size_t),
        "ggml_nelements": ([_ptr], ctypes.c_int64),
        "ggml_is_contiguous": ([_ptr], _bool),
        "ggml_backend_tensor_get": ([_ptr, _ptr, ctypes.c_size_t, ctypes.c_size_t], None),
        "ggml_backend_tensor_set": ([_ptr, _ptr, ctypes.c_size_t, ctypes.c_size_t], None),
        "ggml_op_desc": ([_ptr], ctypes.c_char_p),
        "ggml_quantize_chunk": ([_i32, _ptr, _ptr, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _ptr],
                                ctypes.c_size_t),
        "ggml_quantize_requires_imatrix": ([_i32], _bool),
        "ggml_row_size": ([_i32, ctypes.c_int64], ctypes.c_size_t),
        "ggml_blck_size": ([_i32], ctypes.c_int64),
        "quantize_row_q8_K": ([_ptr, _ptr, ctypes.c_int64], None),
    }
    for name, (args, res) in sig.items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = args, res


def library() -> Library:
    """The bound library (loaded and checked once per process).

    Raises:
        BackendInitializationError: (DF002) xllamacpp missing, or its struct layout not this binding's.
    """
    global _library
    with _lock:
        if _library is None:
            path = library_path()
            try:
                so = ctypes.CDLL(str(path))
            except OSError as exc:
                raise BackendInitializationError(f"cannot load {path}: {exc}", backend="llamacpp") from exc
            context = _probe(so.llama_context_default_params, ContextParams, "context")
            model = _probe(so.llama_model_default_params, ModelParams, "model")
            _check_defaults(context, model)  # type: ignore[arg-type]
            _declare(so)
            so.llama_log_set(_log_callback, None)
            so.llama_backend_init()
            _library = Library(so, path, context, model)  # type: ignore[arg-type]
        return _library


# ---- ggml tensors (in the eval callback) -------------------------------------------------------

class _GgmlTensorHead(ctypes.Structure):
    """The leading fields of ``struct ggml_tensor``: type, buffer, ne[4], nb[4]."""

    _fields_ = [("type", _i32), ("buffer", _ptr), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4)]


def ggml_tensor_name(lib: Library, t: int) -> str:
    """The node's name (``Qcur-0``)."""
    return (lib.so.ggml_get_name(t) or b"").decode("utf-8", "replace")


#: where ``struct ggml_tensor`` keeps ``src[0]`` and ``name`` (type, buffer, ne[4], nb[4], op,
#: op_params[16], flags, then src[10], view_src, view_offs, data, name[64])
_SRC_OFFSET, _NAME_OFFSET = 152, 256


def ggml_tensor_source(lib: Library, t: int, k: int = 0) -> int | None:
    """The address of a node's ``k``-th source; None where this build's ``struct ggml_tensor`` is not
    laid out as expected (its name is not at the expected offset) or the source is absent."""
    name = lib.so.ggml_get_name(t) or b""
    if not 0 <= k < 10 or ctypes.string_at(t + _NAME_OFFSET) != name:
        return None
    return ctypes.c_void_p.from_address(t + _SRC_OFFSET + 8 * k).value or None


def ggml_tensor_shape(t: int) -> tuple[int, int, int, int]:
    """``ne`` of a tensor: ne0 (contiguous) first."""
    head = _GgmlTensorHead.from_address(t)
    return tuple(int(x) for x in head.ne)  # type: ignore[return-value]


def ggml_tensor_type(t: int) -> int:
    """The GGML type id of a tensor."""
    return int(_GgmlTensorHead.from_address(t).type)


def ggml_tensor_array(lib: Library, t: int) -> object:
    """An F32 node as a float32 NumPy array ``[ne3, ne2, ne1, ne0]`` (None for another type). A
    contiguous node is copied as it is; a view with strides of its own (``nb``: Phi-3's ``Vcur-i``, a
    slice of the fused q/k/v projection's rows) is read as the bytes it spans, then gathered along
    its strides (None where a stride is not whole float32 elements: such nodes are not checkpoints)."""
    if ggml_tensor_type(t) != 0:
        return None
    ne = ggml_tensor_shape(t)
    shape = (ne[3], ne[2], ne[1], ne[0])
    if lib.so.ggml_is_contiguous(t):
        out = np.empty(shape, np.float32)
        lib.so.ggml_backend_tensor_get(t, out.ctypes.data, 0, out.nbytes)
        return out
    nb = tuple(int(x) for x in _GgmlTensorHead.from_address(t).nb)
    span = int(lib.so.ggml_nbytes(t))  # from the first element to the last one, along the strides
    if min(ne) < 1 or any(b <= 0 or b % 4 for b in nb) or span % 4:
        return None
    raw = np.empty(span // 4, np.float32)
    lib.so.ggml_backend_tensor_get(t, raw.ctypes.data, 0, span)
    strides = (nb[3], nb[2], nb[1], nb[0])
    if sum((n - 1) * b for n, b in zip(shape, strides)) + 4 > span:
        return None
    return np.lib.stride_tricks.as_strided(raw, shape, strides, writeable=False).copy()


def ggml_tensor_write(lib: Library, t: int, values: object) -> bool:
    """Overwrite a contiguous F32 node with ``values`` (same element count); False where it cannot."""
    data = np.ascontiguousarray(values, dtype=np.float32)
    if ggml_tensor_type(t) != 0 or not lib.so.ggml_is_contiguous(t) or data.size != lib.so.ggml_nelements(t):
        return False
    lib.so.ggml_backend_tensor_set(t, data.ctypes.data, 0, data.nbytes)
    return True



# ---- ggml's quantizers --------------------------------------------------------------------------

#: the super-block of ggml's K-quants and of Q8_K (``QK_K``)
QK_K = 256

#: GGML type ids ``ggml_quantize_chunk`` is asked for here: the K-quants and the type llama.cpp's
#: quantizer falls back to for Q2_K/Q3_K rows that are not whole super-blocks (ids as in ``ggml.h``)
_QUANTIZABLE: dict[str, int] = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20}

#: the weight types written and re-quantized through ggml's own quantizer (:func:`ggml_quantize_rows`)
GGML_QUANTIZED: frozenset[str] = frozenset(_QUANTIZABLE)


def ggml_quantize_rows(lib: Library, rows: np.ndarray, type_name: str) -> np.ndarray:
    """``rows`` (float32 ``[n, n_per_row]``) quantized by ggml's own quantizer, as ``llama-quantize``
    does without an importance matrix (``ggml_quantize_chunk``: the reference kernels,
    ``quantize_row_q4_K_ref`` ...): the stored bytes ``[n, row_size]``.

    Raises:
        BackendInitializationError: (DF002) ``type_name`` is not one quantized here, needs an
            importance matrix, or the rows are not whole blocks of it (ggml would abort the process).
    """
    type_id = _QUANTIZABLE.get(type_name.upper())
    if type_id is None or lib.so.ggml_quantize_requires_imatrix(type_id):
        raise BackendInitializationError(f"ggml's quantizer is not used here for {type_name}", backend="llamacpp",
                                         hint="one of " + ", ".join(_QUANTIZABLE).lower())
    data = np.ascontiguousarray(rows, dtype=np.float32)
    if data.ndim != 2 or data.shape[1] % int(lib.so.ggml_blck_size(type_id)):
        raise BackendInitializationError(
            f"{type_name} quantizes rows of whole blocks of {int(lib.so.ggml_blck_size(type_id))}, not shape "
            f"{data.shape}", backend="llamacpp", hint="fall back to another type for such rows, as llama.cpp does")
    n, per_row = data.shape
    row_size = int(lib.so.ggml_row_size(type_id, per_row))
    out = np.empty((n, row_size), np.uint8)
    written = lib.so.ggml_quantize_chunk(type_id, data.ctypes.data, out.ctypes.data, 0, n, per_row, None)
    if written != out.nbytes:
        raise BackendInitializationError(f"ggml_quantize_chunk wrote {written} bytes of {type_name}, "
                                         f"{out.nbytes} expected", backend="llamacpp")
    return out


#: ``block_q8_K``: float d, int8 qs[256], int16 bsums[16]
_Q8_K_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))])


def ggml_quantize_row_q8_k(lib: Library, values: np.ndarray) -> np.ndarray:
    """``values`` (float32, a multiple of 256 long) through the CPU backend's own
    ``quantize_row_q8_K`` (what its K-quant dot products convert activations with), dequantized:
    ``d * qs`` per block, float32, ``values``' shape."""
    data = np.ascontiguousarray(values, dtype=np.float32).ravel()
    if data.size % QK_K:
        raise ValueError(f"Q8_K quantizes whole blocks of {QK_K} values, not {data.size}")
    blocks = np.zeros(data.size // QK_K, _Q8_K_BLOCK)
    lib.so.quantize_row_q8_K(data.ctypes.data, blocks.ctypes.data, data.size)
    return (blocks["qs"].astype(np.float32) * blocks["d"][:, None]).reshape(np.shape(values))
