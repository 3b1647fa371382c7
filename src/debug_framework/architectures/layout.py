"""Weight layouts: which checkpoint tensor feeds which parameter of a model, declared once per
family (``llama.LAYOUT``, ``bert.LAYOUT``) and read into any array namespace.

Read *streamed* (the NumPy and torch models), a layer's parameters are converted to the compute
dtype when the layer is first asked for and only the most recent layer stays converted
(:class:`LayerStream`); the model's own parameters are converted each time they are read, the
embedding row by row for the ids asked for (:meth:`ModelParameters.rows`) and the LM head in
bounded blocks of rows (:meth:`ModelParameters.project`). The weights themselves stay where the
``WeightStore`` keeps them (memory-mapped files), so a float64 reference holds about one layer of
float64 weights at a time, never a whole-model copy. Read *resident* (an engine that evaluates every
parameter once after loading), everything is converted at construction.

Parameters are plain names (``"q"``, ``"q_b"``, ``"input_norm"``); a module's bias is its
weight's name with ``_b``. No tensor is transposed or fused: ``ops.linear`` takes Hugging Face's
``[out, in]`` weights as they are.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import ModelLoadingError
from .ops import linear
from .xp import Array, ArrayNamespace, DType

__all__ = ["WeightSource", "WeightLayout", "weight_and_bias", "Parameters", "ModelParameters", "LayerStream",
           "HEAD_BLOCK_BYTES", "STREAMED_TABLE_ELEMENTS"]

#: parameter name -> array (``None`` for an optional tensor the checkpoint lacks).
Parameters = dict[str, "Array | None"]

#: the most bytes of converted LM-head (or embedding) rows a streamed model holds at once.
HEAD_BLOCK_BYTES = 64 * 2**20
#: the fewest elements of a two-dimensional parameter outside a model's layers that a streaming
#: backend keeps as stored and converts as used (8M: 64 MiB in float64; a token embedding, an LM head)
STREAMED_TABLE_ELEMENTS = 1 << 23


class WeightSource(Protocol):
    """Canonical tensor name -> tensor: a ``modelio.WeightStore`` (read with its ``numpy(name, dtype)``)
    or any mapping of array-likes."""

    def __contains__(self, name: object) -> bool: ...

    def __getitem__(self, name: str) -> object: ...


def weight_and_bias(**modules: str) -> dict[str, str]:
    """``{param: module.weight, param_b: module.bias}`` for each ``param=module`` (a linear map or a LayerNorm)."""
    out: dict[str, str] = {}
    for param, module in modules.items():
        out[param], out[param + "_b"] = module + ".weight", module + ".bias"
    return out


@dataclass(frozen=True)
class WeightLayout:
    """Where one architecture's parameters come from.

    Attributes:
        model: parameter -> tensor name, for the parameters outside the layers.
        layer_prefix: the layers' common prefix, with ``{i}`` for the layer index.
        layer: parameter -> tensor name under the layer's prefix.
        optional: parameters a checkpoint may lack (they read as ``None``); any other missing
            tensor is a ``ModelLoadingError``.
    """

    model: Mapping[str, str]
    layer_prefix: str
    layer: Mapping[str, str]
    optional: frozenset[str] = field(default_factory=frozenset)

    def tensor_names(self, num_layers: int) -> list[str]:
        """Every tensor name the layout can read, model parameters first."""
        return [*self.model.values(), *(self.layer_prefix.format(i=i) + name
                                        for i in range(num_layers) for name in self.layer.values())]

    def names(self, mapping: Mapping[str, str], prefix: str, weights: WeightSource) -> dict[str, str | None]:
        """parameter -> the tensor name that feeds it (``None`` for an optional tensor the
        checkpoint lacks); a missing required tensor is a ``ModelLoadingError`` (DF004) naming it."""
        out: dict[str, str | None] = {}
        for param, name in mapping.items():
            if prefix + name in weights:
                out[param] = prefix + name
            elif param in self.optional:
                out[param] = None
            else:
                raise ModelLoadingError(f"the checkpoint has no tensor {prefix + name!r}",
                                        hint="is config.json the one of these weights?")
        return out

    def read(self, weights: WeightSource, num_layers: int, xp: ArrayNamespace, dtype: DType, *,
             stream: bool = False) -> tuple[ModelParameters, LayerStream]:
        """The model's parameters and each layer's, as ``xp`` arrays of ``dtype``: converted when
        read and only the latest layer kept with ``stream``, else all converted now. Every tensor's
        presence is checked now either way."""
        converter = _Converter(weights, xp, dtype)
        model = ModelParameters(self.names(self.model, "", weights), converter, resident=not stream)
        layer_names = [self.names(self.layer, self.layer_prefix.format(i=i), weights) for i in range(num_layers)]
        return model, LayerStream(layer_names, converter, keep=1 if stream else num_layers)


def _host_array(data: Any, host: np.dtype, rows: np.ndarray | slice | None = None) -> np.ndarray:
    """A stored tensor (a torch tensor of the file, or any array-like), or only its ``rows`` (ids,
    or a slice: a view, nothing gathered), as a NumPy array of ``host`` (converted as
    ``WeightStore.numpy`` converts)."""
    if hasattr(data, "detach"):  # a torch tensor, often a view of a memory-mapped file
        import torch

        from ..modelio.weights import tensor_numpy

        if isinstance(rows, slice):
            data = data[rows]
        elif rows is not None:
            data = data[torch.from_numpy(np.ascontiguousarray(rows, np.int64))]
        return tensor_numpy(data, host)
    arr = np.asarray(data) if rows is None else np.asarray(data)[rows]
    return np.asarray(arr, dtype=host)


#: stored dtypes (safetensors' names) that float32 holds exactly
_NARROW_STORED = frozenset({"BF16", "F16", "F32", "BFLOAT16", "FLOAT16", "FLOAT32"})


class _Converter:
    """Reads one stored tensor (or some of its rows) into ``xp`` arrays of ``dtype``."""

    def __init__(self, weights: WeightSource, xp: ArrayNamespace, dtype: DType) -> None:
        self.weights, self.xp, self.dtype, self.host = weights, xp, dtype, xp.host_dtype(dtype)
        # below float64, a tensor stored in float32 or narrower is read as float32 even where the
        # namespace reads float64 (both hold it exactly: one rounding to the dtype either way)
        below64 = str(getattr(dtype, "name", dtype)).removeprefix("torch.") not in ("float64", "double")
        self._narrow = below64 and self.host == np.dtype(np.float64) and hasattr(weights, "dtype_name")

    def stored(self, name: str) -> Any:
        return self.weights[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """A stored tensor's shape (nothing read or converted where the store tells it)."""
        weights = self.weights
        return tuple(weights.shape(name)) if hasattr(weights, "shape") else tuple(np.shape(weights[name]))

    def _host_of(self, name: str) -> np.dtype:
        if self._narrow and str(self.weights.dtype_name(name)).upper() in _NARROW_STORED:  # type: ignore[attr-defined]
            return np.dtype(np.float32)
        return self.host

    def __call__(self, name: str, rows: np.ndarray | slice | None = None) -> Array:
        host = self._host_of(name)
        if rows is None and hasattr(self.weights, "numpy"):
            data = self.weights.numpy(name, host)
        else:
            data = _host_array(self.stored(name), host, rows)
        return self.xp.from_host(np.asarray(data, host), self.dtype)


class ModelParameters(Mapping[str, "Array | None"]):
    """The parameters outside the layers (embeddings, final norm, LM head). Resident: converted
    once, at construction. Streamed: converted each time one is read, so none stays converted
    between reads; :meth:`rows` and :meth:`project` read the big ones in bounded pieces."""

    def __init__(self, names: dict[str, str | None], convert: _Converter, *, resident: bool) -> None:
        self._names, self._convert, self.resident = dict(names), convert, resident
        self._values: dict[str, Array | None] = {}
        if resident:
            self._values = {p: None if n is None else convert(n) for p, n in self._names.items()}

    def __getitem__(self, param: str) -> Array | None:
        if param in self._values:
            return self._values[param]
        name = self._names[param]
        return None if name is None else self._convert(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def hold(self, budget: int) -> Callable[[], None]:
        """Keep the streamed parameters converted (the largest last) while together they take at
        most ``budget`` bytes at the compute dtype (a decode reads every one at every step); returns
        what drops them again."""
        if self.resident:
            return lambda: None
        itemsize = max(np.dtype(self._convert.host).itemsize, 1)
        wanted = [p for p, n in self._names.items() if n is not None and p not in self._values]
        sizes = {p: int(np.prod(self._shape(p))) * itemsize for p in wanted}
        held: list[str] = []
        converted: dict[str, Array] = {}  # by tensor: a tied LM head and its embedding converted once
        for param in sorted(wanted, key=lambda p: sizes[p]):
            name = self._names[param]
            assert name is not None
            if name not in converted:
                if sizes[param] > budget:
                    break
                budget -= sizes[param]
                converted[name] = self._convert(name)
            self._values[param] = converted[name]
            held.append(param)

        def drop() -> None:
            for param in held:
                self._values.pop(param, None)
        return drop

    def present(self, param: str) -> bool:
        """Whether the checkpoint holds ``param`` (without reading it)."""
        return self._names.get(param) is not None

    def alias(self, param: str, source: str) -> None:
        """``param`` reads the tensor ``source`` reads (a tied LM head)."""
        self._names[param] = self._names[source]
        if source in self._values:
            self._values[param] = self._values[source]

    def _shape(self, param: str) -> tuple[int, ...]:
        name = self._names[param]
        assert name is not None
        return self._convert.shape(name)

    def rows(self, param: str, ids: Any) -> Array:
        """``param[ids]``: the rows of an embedding table for integer ids of any shape (only those
        rows are read when streamed)."""
        if self.resident or param in self._values:
            return self[param][ids]
        index = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids).astype(np.int64)
        flat = self._convert(self._names[param], index.reshape(-1))
        return flat.reshape(*index.shape, flat.shape[-1])

    def project(self, param: str, x: Array) -> Array:
        """``x @ param.T`` (an LM head ``[V, D]`` applied to ``[..., D]``); streamed, the head is read
        in blocks of rows of at most :data:`HEAD_BLOCK_BYTES` once converted, joined on the last axis."""
        if self.resident or param in self._values:
            return linear(x, self[param])
        vocab, width = self._shape(param)[:2]
        itemsize = max(np.dtype(self._convert.host).itemsize, 1)
        block = max(1, HEAD_BLOCK_BYTES // max(width * itemsize, 1))
        if block >= vocab:
            return linear(x, self[param])
        name = self._names[param]
        parts = [linear(x, self._convert(name, slice(start, min(start + block, vocab))))
                 for start in range(0, vocab, block)]
        return self._convert.xp.concatenate(parts, axis=-1)


class LayerStream(Sequence[Parameters]):
    """Each layer's parameters, converted when the layer is asked for; the ``keep`` most recently
    used layers stay converted (all of them when ``keep`` is the number of layers: resident)."""

    def __init__(self, names: list[dict[str, str | None]], convert: _Converter, *, keep: int) -> None:
        self._names, self._convert, self.keep = names, convert, max(int(keep), 1)
        self._cache: OrderedDict[int, Parameters] = OrderedDict()
        #: how many times a layer was converted (a resident stream converts each once).
        self.conversions = 0
        if self.keep >= len(names):
            for i in range(len(names)):
                self[i]

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, i: int) -> Parameters:  # type: ignore[override]
        i = operator.index(i)  # one layer at a time, by index (a slice is a TypeError)
        if i < 0:
            i += len(self._names)
        if not 0 <= i < len(self._names):
            raise IndexError(i)
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        while len(self._cache) >= self.keep:
            self._cache.popitem(last=False)  # dropped before the next is read: one layer at a time
        params = {p: None if n is None else self._convert(n) for p, n in self._names[i].items()}
        self.conversions += 1
        self._cache[i] = params
        return params

    def hold(self, layers: int) -> Callable[[], None]:
        """Keep the ``layers`` most recently used layers converted (a decode reads every layer at
        every step); returns what puts the stream back as it was."""
        before = self.keep
        self.keep = max(before, min(int(layers), len(self._names)))

        def drop() -> None:
            self.keep = before
            while len(self._cache) > self.keep:
                self._cache.popitem(last=False)
        return drop

    def layer_bytes(self, i: int) -> int:
        """Layer ``i``'s bytes at the compute dtype (its shapes read, nothing converted)."""
        itemsize = max(np.dtype(self._convert.host).itemsize, 1)
        return sum(int(np.prod(self._convert.shape(n))) * itemsize for n in self._names[i].values() if n is not None)

    def resident_layers(self) -> list[int]:
        """The layers converted now."""
        return list(self._cache)
