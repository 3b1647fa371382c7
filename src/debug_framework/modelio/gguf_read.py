"""Read a GGUF file's header, checked, and its tensors dequantized.

:func:`read_gguf` parses the header (magic, version, metadata, tensor infos) with bounds checks on
every count, length, shape and offset against the file's real size, so a malformed file (truncated,
wrong magic, absurd tensor counts or shapes, offsets past the end, a 100 GB claimed size) is a
``ModelLoadingError`` (DF004) saying what is wrong before anything is allocated from what it claims.
Tensors are read through a read-only memory map and dequantized with the ``gguf`` package's NumPy
kernels (every type it knows: F32/F16/BF16, Q4_0 ... Q8_0, K-quants, IQ types).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ModelLoadingError
from .files import regular_file_size

__all__ = ["GGUF_MAGIC", "GgufTensorInfo", "GgufFile", "read_gguf"]

GGUF_MAGIC = b"GGUF"
#: the versions this reader reads (llama.cpp writes 3; 2 differs only in nothing we read)
_VERSIONS = (2, 3)
#: at most this many dimensions per tensor (ggml's GGML_MAX_DIMS)
_MAX_DIMS = 4
#: metadata arrays longer than this are counted, not kept (a vocabulary's tokens)
_KEEP_ARRAY = 64

# GGUF metadata value types -> (struct format, size); 8 string, 9 array
_SCALARS: dict[int, tuple[str, int]] = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
                                         5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
                                         12: ("<d", 8)}
_STRING, _ARRAY = 8, 9


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """GGML type id -> (name, block size in elements, bytes per block), from the ``gguf`` package."""
    import gguf

    return {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType
            if t in gguf.GGML_QUANT_SIZES}


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor of a GGUF file: name, shape as NumPy/Hugging Face order it (rows last dim
    contiguous: ``(out, in)`` for a weight), GGML type, byte offset in the data section and size."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    type_name: str
    offset: int
    nbytes: int


@dataclass
class GgufFile:
    """A checked GGUF header: metadata (long arrays as their length), tensor infos, where the data starts."""

    path: Path
    version: int
    metadata: dict[str, object]
    tensors: dict[str, GgufTensorInfo]
    data_start: int
    alignment: int
    array_lengths: dict[str, int] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        """``general.architecture`` (``llama``, ``qwen2`` ...)."""
        return str(self.metadata.get("general.architecture", ""))

    def key(self, name: str, default: object = None) -> object:
        """The architecture's key ``<arch>.name`` (``block_count``), or ``default``."""
        return self.metadata.get(f"{self.architecture}.{name}", default)

    def positive_int(self, name: str, default: int | None = None) -> int:
        """The architecture's key ``name`` as a positive integer (DF004 where it is not)."""
        value = self.key(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelLoadingError(f"GGUF key {self.architecture}.{name} must be a positive integer, got {value!r}",
                                    file=str(self.path))
        return value

    def number(self, name: str, default: float) -> float:
        """The architecture's key ``name`` as a number (DF004 where it is not)."""
        value = self.key(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadingError(f"GGUF key {self.architecture}.{name} must be a number, got {value!r}",
                                    file=str(self.path))
        return float(value)

    def tensor_types(self) -> dict[str, str]:
        """Tensor name -> its GGML type name (``Q8_0``)."""
        return {t.name: t.type_name for t in self.tensors.values()}

    def read(self, name: str, index: int | None = None) -> np.ndarray:
        """Tensor ``name`` dequantized to float32, shaped as :attr:`GgufTensorInfo.shape`; with
        ``index``, only ``tensor[index]`` (one expert of a stacked ``[experts, ...]`` tensor: its
        bytes alone are read, whole rows of whole blocks)."""
        import gguf

        info = self.tensors[name]
        shape, count, offset = info.shape, info.nbytes, 0
        if index is not None:
            if not 0 <= index < info.shape[0]:
                raise ModelLoadingError(f"tensor {name} has {info.shape[0]} entries, not {index + 1}",
                                        file=str(self.path), tensor=name)
            count = info.nbytes // info.shape[0]
            shape, offset = info.shape[1:], index * count
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            start = self.data_start + info.offset + offset
            raw = np.frombuffer(mm, dtype=np.uint8, count=count, offset=start).copy()
        qtype = gguf.GGMLQuantizationType(info.type_id)
        if qtype == gguf.GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(shape)
        if qtype == gguf.GGMLQuantizationType.F16:
            return raw.view(np.float16).astype(np.float32).reshape(shape)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = raw.reshape(-1, info.shape[-1] // block * size)
        try:
            out = gguf.quants.dequantize(rows, qtype)
        except NotImplementedError as exc:
            raise ModelLoadingError(f"tensor type {info.type_name} cannot be dequantized here: {exc}",
                                    file=str(self.path), tensor=name,
                                    hint="convert the file to a type the gguf package reads") from exc
        return np.asarray(out, dtype=np.float32).reshape(shape)


class _Cursor:
    """Bounded little-endian reads over a memory map: every read past the end is DF004 ``truncated``."""

    def __init__(self, mm: mmap.mmap, path: Path) -> None:
        self.mm, self.pos, self.size, self.path = mm, 0, len(mm), path

    def fail(self, what: str) -> ModelLoadingError:
        return ModelLoadingError(f"malformed GGUF: {what}", file=str(self.path),
                                 hint="re-download or re-convert the file (llama.cpp's convert_hf_to_gguf.py)")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"file is truncated: {what} needs {n} bytes at offset {self.pos}, "
                            f"the file has {self.size}")
        out = self.mm[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> object:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", what))  # type: ignore[call-overload]

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", what))  # type: ignore[call-overload]

    def string(self, what: str) -> str:
        n = self.u64(f"{what}'s length")
        if n > self.size - self.pos:
            raise self.fail(f"{what} claims {n} bytes, past the end of the file ({self.size} bytes)")
        return self.take(n, what).decode("utf-8", errors="replace")

    def count(self, what: str, minimum_each: int) -> int:
        """A count of items of at least ``minimum_each`` bytes each, checked against the bytes left."""
        n = self.u64(what)
        if n * minimum_each > self.size - self.pos:
            raise self.fail(f"absurd {what} {n}: the {self.size - self.pos} bytes left hold at most "
                            f"{(self.size - self.pos) // minimum_each}")
        return n


def _value(c: _Cursor, vtype: int, key: str) -> tuple[object, int | None]:
    """One metadata value; an array longer than ``_KEEP_ARRAY`` comes back as None and its length."""
    if vtype in _SCALARS:
        fmt, _ = _SCALARS[vtype]
        return c.unpack(fmt, f"the value of {key}"), None
    if vtype == _STRING:
        return c.string(f"the value of {key}"), None
    if vtype != _ARRAY:
        raise c.fail(f"metadata {key!r} has unknown value type {vtype}")
    etype = c.u32(f"the element type of {key}")
    if etype == _ARRAY:
        raise c.fail(f"metadata {key!r} is an array of arrays")
    if etype != _STRING and etype not in _SCALARS:
        raise c.fail(f"metadata {key!r} has unknown element type {etype}")
    size = 8 if etype == _STRING else _SCALARS[etype][1]
    n = c.count(f"length of array {key!r}", size)
    if etype != _STRING and n > _KEEP_ARRAY:
        c.take(n * size, f"array {key!r}")
        return None, n
    items = [_value(c, etype, key)[0] for _ in range(n)]
    return (items, None) if n <= _KEEP_ARRAY else (None, n)


def _tensor_info(c: _Cursor, types: dict[int, tuple[str, int, int]]) -> GgufTensorInfo:
    name = c.string("a tensor name")
    n_dims = c.u32(f"the dimension count of tensor {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise c.fail(f"tensor {name!r} claims {n_dims} dimensions (ggml allows 1 to {_MAX_DIMS})")
    ne = [c.u64(f"a dimension of tensor {name!r}") for _ in range(n_dims)]
    type_id = c.u32(f"the type of tensor {name!r}")
    offset = c.u64(f"the offset of tensor {name!r}")
    if type_id not in types:
        raise c.fail(f"tensor {name!r} has unknown GGML type {type_id}")
    type_name, block, block_bytes = types[type_id]
    if any(d == 0 for d in ne) or ne[0] % block:
        raise c.fail(f"tensor {name!r} has shape {ne}: zero dimensions or rows not a whole number of "
                     f"{type_name} blocks ({block})")
    elements = 1
    for d in ne:
        elements *= d
        if elements > c.size * block:  # more elements than the file's bytes could hold at any type
            raise c.fail(f"tensor {name!r} claims shape {ne}, more than the {c.size}-byte file can hold")
    return GgufTensorInfo(name, tuple(reversed(ne)), type_id, type_name, offset, elements // block * block_bytes)


def read_gguf(path: Path | str) -> GgufFile:
    """The checked header of the GGUF file ``path``.

    Raises:
        ModelLoadingError: (DF004) not a regular file, wrong magic or version, truncated, absurd
            counts, lengths or shapes, unknown types, tensors past the end of the file or overlapping
            it — each said with the file and what is wrong.
    """
    path = Path(path)
    size = regular_file_size(path)
    if size < 24:
        raise ModelLoadingError(f"malformed GGUF: file is truncated ({size} bytes, shorter than a GGUF header)",
                                file=str(path))
    types = _ggml_types()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        c = _Cursor(mm, path)
        magic = c.take(4, "the magic")
        if magic != GGUF_MAGIC:
            raise c.fail(f"wrong magic {magic!r}: not a GGUF file (it starts with {GGUF_MAGIC!r})")
        version = c.u32("the version")
        if version not in _VERSIONS:
            raise c.fail(f"GGUF version {version} (this reader reads {', '.join(map(str, _VERSIONS))})")
        n_tensors = c.count("tensor count", 4 + 8 + 4 + 8 + 8 + 8)
        n_kv = c.count("metadata count", 8 + 4 + 1)
        metadata: dict[str, object] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = c.string("a metadata key")
            value, length = _value(c, c.u32(f"the type of {key}"), key)
            if length is not None:
                lengths[key] = length
            metadata[key] = value
        infos = [_tensor_info(c, types) for _ in range(n_tensors)]
        alignment = metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise c.fail(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-c.pos // alignment) * alignment
    tensors: dict[str, GgufTensorInfo] = {}
    for info in infos:
        if info.name in tensors:
            raise ModelLoadingError(f"malformed GGUF: tensor {info.name!r} appears twice", file=str(path))
        end = data_start + info.offset + info.nbytes
        if info.offset % alignment or end > size:
            raise ModelLoadingError(
                f"malformed GGUF: tensor {info.name!r} ({info.nbytes} bytes at data offset {info.offset}) "
                f"lies past the end of the file ({size} bytes) or is misaligned",
                file=str(path), tensor=info.name, hint="the file is truncated or corrupt: re-download or re-convert it")
        tensors[info.name] = info
    return GgufFile(path, version, metadata, tensors, data_start, alignment, lengths)

