"""Captured checkpoints kept within a memory budget: what a run captures beyond it is written to
disk as it is produced and read back memory-mapped (issue 28).

A validation run captures every checkpoint and layer input of three runs (reference,
alternative, calibration): ``3 x (3 x layers + 2)`` activations plus the logits. Held in memory
they grow with the layers and the batch. While a :class:`CaptureSink` is active
(:func:`capture_sink`), the dictionaries a backend fills as the model runs
(:func:`checkpoint_dict`: the architectures' walk, :class:`~.hooks.HookCapture`) are
:class:`SpillingDict`\\ s: a tensor stored while the sink's in-memory total is within its budget
stays in memory; one that would go beyond it is written to one raw file under the sink's
directory at once (the backend's own reference then goes when the model moves on) and is read
back as a memory-mapped array of the same dtype, shape and values (a torch tensor over the mapped
file for a torch tensor; copy-on-write, so nothing a reader does reaches the file). The judge
therefore sees bit for bit what it would have seen in memory.

The sink also reports each layer as its checkpoints arrive (``on_layer``): the progress of a
forward pass, layer by layer, for any backend that captures through :func:`checkpoint_dict`.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from .keys import CapturedTensor

if TYPE_CHECKING:
    import torch

K = TypeVar("K", bound=Hashable)

__all__ = ["CaptureSink", "SpillingDict", "capture_sink", "checkpoint_dict", "active_sink", "tensor_nbytes"]

_ACTIVE: ContextVar[CaptureSink | None] = ContextVar("debug_framework_capture_sink", default=None)


@dataclass(frozen=True)
class _Spilled:
    """One tensor on disk: its file, NumPy storage dtype and shape, and its torch dtype (None: NumPy)."""

    path: Path
    storage: np.dtype
    shape: tuple[int, ...]
    torch_dtype: torch.dtype | None = None

    def load(self) -> CapturedTensor:
        """The tensor, memory-mapped (copy-on-write: writable, the file unchanged)."""
        if int(np.prod(self.shape)) == 0:
            arr = np.empty(self.shape, self.storage)
        else:
            arr = np.memmap(self.path, dtype=self.storage, mode="c", shape=self.shape or (1,)).reshape(self.shape)
        if self.torch_dtype is None:
            return np.asarray(arr)  # a plain array over the mapping
        import torch

        t = torch.from_numpy(arr)
        return t if t.dtype == self.torch_dtype else t.view(self.torch_dtype)


def tensor_nbytes(value: object) -> int | None:
    """The bytes of a NumPy array's or a torch tensor's elements (None: neither)."""
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    numel, itemsize = getattr(value, "numel", None), getattr(value, "element_size", None)
    if callable(numel) and callable(itemsize):
        return int(numel()) * int(itemsize())
    return None


@dataclass
class CaptureSink:
    """Where one validation run's captured checkpoints go beyond ``budget`` bytes in memory.

    Attributes:
        directory: the folder spilled tensors are written to (made on first use; :meth:`close`
            removes it). None: a temporary folder of the system's.
        budget: bytes of captured tensors kept in memory, all dictionaries of the sink together
            (counted as they are stored: a dictionary's tensors may outlive it in the capture
            the backend returns, so what one held is not given back).
        on_layer: called with the layers done as a per-layer checkpoint arrives (progress).
    """

    directory: Path | None = None
    budget: int = 64 * 2**20
    on_layer: Callable[[int], None] | None = None
    resident: int = 0  # bytes now held in memory by the sink's dictionaries
    spilled_bytes: int = 0  # bytes written to disk so far
    peak_resident: int = 0
    _dir: Path | None = field(default=None, repr=False)
    _names: Iterator[int] = field(default_factory=itertools.count, repr=False)
    _made_dir: bool = field(default=False, repr=False)

    def folder(self) -> Path:
        """The spill folder, made now if needed."""
        if self._dir is None:
            if self.directory is None:
                self._dir, self._made_dir = Path(tempfile.mkdtemp(prefix="debug_capture_spill_")), True
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._dir, self._made_dir = self.directory, True
        return self._dir

    def write(self, value: CapturedTensor) -> _Spilled | None:
        """``value`` written to a file of its own, or None for what stays in memory (a tensor on
        an accelerator, anything not an array)."""
        torch_dtype = None
        if isinstance(value, np.ndarray):
            arr = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # (keeps a 0-d array 0-d)
        elif type(value).__module__.startswith("torch") and hasattr(value, "device"):
            if value.device.type != "cpu" or value.is_sparse:
                return None
            import torch

            t = value.detach().contiguous()
            torch_dtype = t.dtype
            try:
                arr = t.numpy()
            except TypeError:  # no NumPy dtype (bfloat16, float8): its bits as integers of its width
                arr = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).numpy()
        else:
            return None
        if arr.dtype.hasobject:
            return None
        path = self.folder() / f"{next(self._names)}.bin"
        arr.tofile(path)
        self.spilled_bytes += arr.nbytes
        return _Spilled(path, arr.dtype, tuple(arr.shape), torch_dtype)

    def layer_reached(self, key: object) -> None:
        """Progress: ``key`` (a checkpoint key, a ``(name, layer)`` tuple, or a layer index of the
        layer inputs) just arrived."""
        if self.on_layer is None:
            return
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int):
            self.on_layer(key[1] + 1 if key[0] == "post_mlp" else key[1])
        elif isinstance(key, int):
            self.on_layer(key)

    def close(self) -> None:
        """Remove the spill folder (every spilled tensor goes with it)."""
        if self._dir is not None and self._made_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None


class SpillingDict(MutableMapping[K, CapturedTensor], Generic[K]):
    """A dictionary of captured tensors within its sink's memory budget (see the module's text)."""

    def __init__(self, sink: CaptureSink) -> None:
        self._sink = sink
        self._held: dict[K, CapturedTensor | _Spilled] = {}  # key -> the tensor, or a _Spilled
        self._sizes: dict[K, int] = {}  # bytes held in memory per key

    def __setitem__(self, key: K, value: CapturedTensor) -> None:
        sink = self._sink
        if key in self._held:
            del self[key]
        size = tensor_nbytes(value) or 0
        spilled = None
        if sink.resident + size > sink.budget:
            try:
                spilled = sink.write(value)
            except OSError:  # a full or unwritable disk: this one stays in memory, the run goes on
                spilled = None
        if spilled is not None:
            self._held[key] = spilled
        else:
            self._held[key] = value
            self._sizes[key] = size
            sink.resident += size
            sink.peak_resident = max(sink.peak_resident, sink.resident)
        sink.layer_reached(key)

    def __getitem__(self, key: K) -> CapturedTensor:
        value = self._held[key]
        return value.load() if isinstance(value, _Spilled) else value

    def __delitem__(self, key: K) -> None:
        del self._held[key]
        self._sink.resident -= self._sizes.pop(key, 0)

    def __iter__(self) -> Iterator[K]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def spilled(self) -> int:
        """How many of its tensors are on disk."""
        return sum(isinstance(v, _Spilled) for v in self._held.values())


def active_sink() -> CaptureSink | None:
    """The sink of the run in progress, if any."""
    return _ACTIVE.get()


def checkpoint_dict() -> MutableMapping[K, CapturedTensor]:
    """The dictionary a backend fills with captured tensors as the model runs: a
    :class:`SpillingDict` while a sink is active, else a plain ``dict``."""
    sink = _ACTIVE.get()
    return {} if sink is None else SpillingDict(sink)


@contextlib.contextmanager
def capture_sink(sink: CaptureSink | None) -> Iterator[CaptureSink | None]:
    """Make ``sink`` the active one for the block (None: none active)."""
    token = _ACTIVE.set(sink)
    try:
        yield sink
    finally:
        _ACTIVE.reset(token)
