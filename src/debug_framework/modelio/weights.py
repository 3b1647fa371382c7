"""Lazy weight readers for safetensors, ``.zt`` (ztensor 2.x) and ``torch.load(weights_only=True)`` files.

A :class:`WeightStore` maps canonical tensor names to the file that holds them. Nothing is read
until a tensor is asked for: safetensors are opened with ``safe_open`` (memory-mapped), ``.zt``
tensors come zero-copy through DLPack, ``.bin``/``.pt`` files are memory-mapped by ``torch.load``.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import DTypeLike

if TYPE_CHECKING:  # torch is imported where a tensor is read: an ONNX file's path never needs it
    import torch

from ..errors import ModelLoadingError
from .files import read_head, regular_file_size, short_repr

__all__ = ["TensorReader", "SafetensorsReader", "ZTensorReader", "TorchFileReader", "WeightStore", "ZT_MAGIC",
           "FLOAT_DTYPES", "torch_dtype_name"]

#: The first eight bytes of every ztensor 2.x file.
ZT_MAGIC = b"\x89ZT2\r\n\x1a\n"
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class TensorReader(Protocol):
    """One weights file: names, shapes and dtypes from its header, tensors on demand."""

    path: Path

    def names(self) -> list[str]: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def dtype(self, name: str) -> str: ...
    def tensor(self, name: str) -> torch.Tensor: ...


def _head(path: Path, n: int) -> bytes:
    """At most the first ``n`` bytes of the regular file ``path`` (DF004 for anything else)."""
    return read_head(path, n)


#: The dtypes the reference reads weights in (safetensors' names; the other readers map to them).
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
_TORCH_DTYPE_NAMES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``F32`` for ``torch.float32`` (safetensors' name); other dtypes by torch's name."""
    name = str(dtype).removeprefix("torch.")
    return _TORCH_DTYPE_NAMES.get(name, name)


class SafetensorsReader:
    """A ``.safetensors`` file read through ``safe_open`` (memory-mapped, lazy)."""

    def __init__(self, path: Path) -> None:
        from safetensors import SafetensorError, safe_open

        self.path = path
        size = regular_file_size(path)
        head = _head(path, 9)
        if len(head) < 9:
            raise ModelLoadingError("file is truncated: shorter than a safetensors header", file=str(path))
        (header_len,) = struct.unpack("<Q", head[:8])
        if head[8:9] != b"{":
            raise ModelLoadingError(
                "wrong magic: the file does not start with a safetensors header (8-byte length + JSON)",
                file=str(path),
            )
        if 8 + header_len > size:
            raise ModelLoadingError(
                f"file is truncated: its header says {header_len} header bytes, the file has {size}", file=str(path)
            )
        try:
            self._handle = safe_open(str(path), framework="pt", device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            kind = "truncated" if "not fully covered" in str(exc) else "corrupt"
            raise ModelLoadingError(f"file is {kind}: {exc}", file=str(path)) from exc
        self._names = list(self._handle.keys())

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle.get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return str(self._handle.get_slice(name).get_dtype())

    def tensor(self, name: str) -> torch.Tensor:
        try:
            return self._handle.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadingError(f"cannot read tensor: {exc}", file=str(self.path), tensor=name) from exc


class ZTensorReader:
    """A ``.zt`` file (ztensor 2.x); tensors come zero-copy through DLPack."""

    def __init__(self, path: Path) -> None:
        import ztensor

        self.path = path
        head = _head(path, len(ZT_MAGIC))
        if len(head) < len(ZT_MAGIC):
            raise ModelLoadingError("file is truncated: shorter than the .zt magic", file=str(path))
        if head != ZT_MAGIC:
            raise ModelLoadingError(
                f"wrong magic: expected {ZT_MAGIC!r} for a .zt file, found {head!r}", file=str(path)
            )
        try:
            self._src = ztensor.open(str(path))
            self._names = list(self._src.keys())
        except (ValueError, OSError, RuntimeError) as exc:
            raise ModelLoadingError(f"file is truncated or corrupt: {exc}", file=str(path)) from exc

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._src[name].shape)

    def dtype(self, name: str) -> str:
        return str(self._src[name].dtype).upper()

    def tensor(self, name: str) -> torch.Tensor:
        t = self._src[name]
        if t.layout != "dense":
            raise ModelLoadingError(f"tensor layout {t.layout!r} is not supported", file=str(self.path), tensor=name)
        try:
            import torch

            return torch.from_dlpack(t)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise ModelLoadingError(f"cannot read tensor: {exc}", file=str(self.path), tensor=name) from exc


def _check_plain_tensor(path: Path, key: object, value: torch.Tensor) -> None:
    """A state dict entry must be a string key and a dense CPU tensor (not sparse, quantized, nested or meta)."""
    import torch

    if not isinstance(key, str):
        raise ModelLoadingError(f"state dict key {short_repr(key)} is not a string", file=str(path))
    kind = ("sparse" if value.layout != torch.strided else "quantized" if value.is_quantized
            else "nested" if value.is_nested else "" if value.device.type == "cpu" else f"on {value.device.type}")
    if kind:
        raise ModelLoadingError(f"the tensor is {kind}; only dense tensors are read", file=str(path), tensor=key)


class TorchFileReader:
    """A ``.bin``/``.pt`` state dict, loaded only with ``torch.load(weights_only=True)``."""

    def __init__(self, path: Path) -> None:
        import torch

        self.path = path
        head = _head(path, 4)
        if not (head == _ZIP_MAGIC or head[:2] in _PICKLE_PROTOCOLS):
            raise ModelLoadingError(
                f"wrong magic: not a torch.save file (found {head!r})", file=str(path)
            )
        try:
            try:
                obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds for bad archives; all mean the same here
            raise ModelLoadingError(
                f"file is truncated, corrupt or holds more than tensors: {exc}".split("\n")[0],
                hint="only plain state dicts are read; nothing else is unpickled",
                file=str(path),
            ) from exc
        if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
            obj = obj["state_dict"]
        if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise ModelLoadingError("file does not hold a state dict of tensors", file=str(path))
        for key, value in obj.items():
            _check_plain_tensor(path, key, value)
        self._tensors: dict[str, torch.Tensor] = dict(obj)

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def dtype(self, name: str) -> str:
        return torch_dtype_name(self._tensors[name].dtype)

    def tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


def tensor_numpy(t: torch.Tensor, dtype: DTypeLike = np.float64) -> np.ndarray:
    """A CPU tensor as a NumPy array of ``dtype`` (a copy unless the dtype already matches).

    A floating tensor goes to a floating ``dtype`` in one conversion by torch (multi-threaded;
    widening is exact, narrowing rounds once to nearest even, as NumPy's cast does), never
    through an intermediate array; anything else through float32 (half precision) and NumPy."""
    import torch

    target = np.dtype(dtype)
    to = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32,
          np.dtype(np.float16): torch.float16}.get(target)
    if to is not None and t.is_floating_point():
        if t.dtype == to:
            return t.numpy()
        out = np.empty(tuple(t.shape), target)  # NumPy's memory, filled by torch's conversion
        torch.from_numpy(out).copy_(t)
        return out
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.to(torch.float32)
    return np.asarray(t.numpy(), dtype=target)


class WeightStore(Mapping[str, "torch.Tensor"]):
    """Canonical tensor name -> tensor, read lazily from one or more files.

    ``store["model.embed_tokens.weight"]`` returns a CPU torch tensor in the file's dtype (a view
    of the file where the format allows). :meth:`numpy` converts to a NumPy array of a dtype.
    """

    def __init__(self, locations: dict[str, tuple[TensorReader, str]], *, private: bool = False) -> None:
        self._loc = locations
        #: a fork's own readers, one per file, opened on first use (None: the readers of ``locations``)
        self._own: dict[Path, TensorReader] | None = {} if private else None
        self._parent: WeightStore | None = None
        self._digest: str | None = None
        self._digesting: threading.Thread | None = None  # start_digest's
        self._digest_error: BaseException | None = None
        self._digest_cancel = threading.Event()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._loc:
            raise KeyError(name)
        reader, stored = self._loc[name]
        if self._own is None:
            return reader.tensor(stored)
        if isinstance(reader, ZTensorReader):  # its mapping is read-only: a write would crash the process
            return reader.tensor(stored).clone()
        own = self._own.get(reader.path)
        if own is None:
            own = self._own[reader.path] = type(reader)(reader.path)  # type: ignore[call-arg]
        return own.tensor(stored)

    def __contains__(self, name: object) -> bool:  # from the names alone: no file is opened
        return name in self._loc

    def __iter__(self) -> Iterator[str]:
        return iter(self._loc)

    def __len__(self) -> int:
        return len(self._loc)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape from the file header, without reading the data."""
        reader, stored = self._loc[name]
        return reader.shape(stored)

    def dtype_name(self, name: str) -> str:
        """The stored dtype from the file header (safetensors' names: ``BF16``, ``F32`` ...), without reading the data."""
        reader, stored = self._loc[name]
        return reader.dtype(stored)

    def file_of(self, name: str) -> Path:
        """The file that holds ``name``."""
        return self._loc[name][0].path

    def numpy(self, name: str, dtype: DTypeLike = np.float64) -> np.ndarray:
        """The tensor as a NumPy array of ``dtype`` (a copy unless the dtype already matches)."""
        return tensor_numpy(self[name], dtype)

    def fork(self) -> WeightStore:
        """The same weights as a store of their own (:attr:`private`): each file opened anew, when a
        tensor of it is first asked for, through a mapping of its own (safetensors and torch files:
        copy-on-write, so no copy is made and no memory is used until written). A write to a
        tensor of the fork (a backend fusing, folding or quantizing its weights in place) is seen by
        no other store, and never reaches the file; a ``.zt`` file, whose mapping is read-only, gives
        the fork a fresh copy of a tensor each time it is asked for. The fork's :attr:`digest` is
        this store's."""
        fork = WeightStore(self._loc, private=True)
        fork._parent = self
        return fork

    def reading(self, name: str) -> torch.Tensor:
        """``name`` to be read, never written (converted to another dtype, say): a fork's own tensor
        where the fork has already handed out a tensor of that file (which may have been written),
        else the tensor of the mapping the loaded weights' other readers share, whose pages the
        resident set then counts once."""
        reader, stored = self._loc[name]
        if self._own is None or reader.path in self._own:
            return self[name]
        return reader.tensor(stored)

    @property
    def private(self) -> bool:
        """Whether this store is a :meth:`fork`: its tensors are its holder's own to write."""
        return self._own is not None

    def changed(self, expected: str | None = None, *, limit: int = 5) -> list[str]:
        """The tensors whose bytes are no longer those of the digest ``expected`` (default: the
        :attr:`digest` computed when the weights were loaded): a reader wrote into the mapping this
        store hands out. At most ``limit`` names; ``[]`` when the weights, hashed again, still give
        the digest. Each tensor is compared with a fresh mapping of its file, which a write through
        this store's mapping never reaches."""
        recorded = expected or self.digest
        if self._compute_digest() == recorded:
            return []
        import torch

        fresh = WeightStore(self._loc, private=True)
        names = []
        for name in sorted(self._loc):
            if not torch.equal(self[name], fresh[name]):
                names.append(name)
                if len(names) >= limit:
                    break
        return names or ["(the tensors' names, shapes or dtypes)"]

    @property
    def digest(self) -> str:
        """SHA-256 over (name, dtype, shape, bytes) of every tensor, names sorted.

        Independent of the container format and of the order tensors are stored in, so the same
        weights saved as a HF directory and as a ``.zt`` file share a digest.
        """
        if self._digesting is not None:
            self._digesting.join()
            self._digesting = None
            if self._digest_error is not None:
                error, self._digest_error = self._digest_error, None
                raise error
        if self._digest is None and self._parent is not None:
            self._digest = self._parent.digest
        if self._digest is None:
            self._digest = self._compute_digest()
        return self._digest

    def start_digest(self) -> None:
        """Start computing :attr:`digest` on a thread of its own, so that it overlaps what the
        caller does next (SHA-256 releases the GIL: reading a multi-gigabyte file's hash beside
        Python imports or a model build); :attr:`digest` then waits for it."""
        if self._digest is not None or self._digesting is not None:
            return

        def work() -> None:
            try:
                self._digest = self._compute_digest()
            except BaseException as exc:  # noqa: BLE001 - raised again by the digest property
                self._digest_error = exc

        self._digest_cancel.clear()
        self._digesting = threading.Thread(target=work, name="weights-digest", daemon=True)
        self._digesting.start()

    def cancel_digest(self) -> None:
        """Stop a digest :meth:`start_digest` began (the caller failed and will not read it) and wait
        for its thread, which stops within one block of hashing: no thread is left inside the
        weights' files when the process exits."""
        if self._digesting is None:
            return
        self._digest_cancel.set()
        self._digesting.join()
        self._digest_cancel.clear()
        self._digesting, self._digest_error = None, None

    def _compute_digest(self) -> str:
        import torch

        h = hashlib.sha256()
        block = 64 * 2**20
        for name in sorted(self._loc):
            t = self[name].contiguous()
            h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode())
            data = memoryview(t.view(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
            for start in range(0, len(data), block):  # the same hash as one update of the whole
                if self._digest_cancel.is_set():
                    raise RuntimeError("the weights' digest was cancelled")
                h.update(data[start:start + block])
        return h.hexdigest()
