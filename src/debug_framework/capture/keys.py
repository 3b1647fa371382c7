"""Checkpoint keys, checkpoint selections and the ``Capture`` a backend run returns.

A checkpoint is a named point in a model's forward pass (see ``ARCHITECTURE.md``):

* ``post_embedding`` – the embedding output fed to layer 0 (``layer`` is ``None``);
* ``post_attention`` – per layer, the residual stream right after the attention block;
* ``post_mlp`` – per layer, the layer's output;
* ``post_processing`` – the final output: logits of a causal LM, last hidden state of an encoder;
* ``router_logits`` – per mixture-of-experts layer, the router's logits (the expert choice is
  compared too); present only for the layers a model routes (``all_checkpoints(n, router_layers)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from ..checkpoint_ids import checkpoint_id
from ..errors import ConfigurationError
from ..jsonio import JsonObject
from ..suggest import did_you_mean

if TYPE_CHECKING:
    import numpy as np
    import torch

#: What a backend captures at a checkpoint (or as a layer's input): a torch tensor or a NumPy array.
CapturedTensor: TypeAlias = "torch.Tensor | np.ndarray"

__all__ = [
    "CHECKPOINT_NAMES",
    "PER_LAYER_CHECKPOINTS",
    "CheckpointKey",
    "layer_input_key",
    "CheckpointSelection",
    "Capture",
    "all_checkpoints",
]

#: Checkpoint names in execution order.
CHECKPOINT_NAMES: tuple[str, ...] = ("post_embedding", "post_attention", "router_logits", "post_mlp",
                                     "post_processing")
#: The names that exist once per layer.
PER_LAYER_CHECKPOINTS: frozenset[str] = frozenset({"post_attention", "router_logits", "post_mlp"})


class CheckpointKey(NamedTuple):
    """One checkpoint: ``CheckpointKey("post_attention", 3)`` or ``CheckpointKey("post_embedding", None)``."""

    name: str
    layer: int | None = None

    def validate(self) -> CheckpointKey:
        """Return ``self`` if it names a real checkpoint, else raise ``ConfigurationError`` (DF005)."""
        if self.name not in CHECKPOINT_NAMES:
            raise ConfigurationError(
                f"unknown checkpoint name {self.name!r}" + did_you_mean(self.name, CHECKPOINT_NAMES),
                hint=f"use one of {', '.join(CHECKPOINT_NAMES)}",
                checkpoint=self.name,
            )
        per_layer = self.name in PER_LAYER_CHECKPOINTS
        if per_layer and (not isinstance(self.layer, int) or self.layer < 0):
            raise ConfigurationError(
                f"checkpoint {self.name!r} needs a layer index >= 0, got {self.layer!r}", checkpoint=self.name
            )
        if not per_layer and self.layer is not None:
            raise ConfigurationError(f"checkpoint {self.name!r} has no layer, got {self.layer!r}", checkpoint=self.name)
        return self

    def to_json(self) -> JsonObject:
        """``{"checkpoint": name, "layer": layer}``."""
        return {"checkpoint": self.name, "layer": self.layer}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> CheckpointKey:
        """Inverse of :meth:`to_json`."""
        try:
            layer = data.get("layer")
            return cls(str(data["checkpoint"]), None if layer is None else int(layer)).validate()
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{dict(data)!r} is not a checkpoint: {exc!r}", hint='use {"checkpoint": name, "layer": layer}'
            ) from exc

    @classmethod
    def parse(cls, value: CheckpointKey | tuple[str, int | None] | str | Mapping[str, object]) -> CheckpointKey:
        """Accept a key, a ``(name, layer)`` tuple, ``"post_mlp:2"`` / ``"post_embedding"``, or the JSON form."""
        if isinstance(value, CheckpointKey):
            return value.validate()
        if isinstance(value, Mapping):
            return cls.from_json(value)
        try:
            if isinstance(value, str):
                name, _, layer = value.partition(":")
                return cls(name, int(layer) if layer else None).validate()
            name, layer = value
            return cls(str(name), None if layer is None else int(layer)).validate()
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{value!r} is not a checkpoint: {exc}",
                hint='write "post_mlp:2", "post_embedding", (name, layer) or {"checkpoint": name, "layer": layer}',
            ) from exc

    def __str__(self) -> str:
        return checkpoint_id(self.name, self.layer)


def layer_input_key(i: int) -> CheckpointKey:
    """The checkpoint whose tensor is layer ``i``'s input: the embedding's, else layer i - 1's output."""
    return CheckpointKey("post_embedding") if i == 0 else CheckpointKey("post_mlp", i - 1)


def all_checkpoints(num_layers: int, router_layers: Iterable[int] = ()) -> list[CheckpointKey]:
    """Every checkpoint of a model with ``num_layers`` layers, in execution order; the layers in
    ``router_layers`` (mixture of experts) add their ``router_logits``."""
    routed = set(router_layers)
    keys = [CheckpointKey("post_embedding")]
    for i in range(num_layers):
        keys.append(CheckpointKey("post_attention", i))
        if i in routed:
            keys.append(CheckpointKey("router_logits", i))
        keys.append(CheckpointKey("post_mlp", i))
    keys.append(CheckpointKey("post_processing"))
    return keys


@dataclass(frozen=True)
class CheckpointSelection:
    """A subset of checkpoints: by name and by an (inclusive-exclusive) layer range.

    ``CheckpointSelection()`` selects everything. ``layers=(2, 4)`` keeps per-layer checkpoints of
    layers 2 and 3; the layer-less checkpoints are kept unless excluded by ``names``.
    """

    names: frozenset[str] | None = None
    layers: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.names is not None:
            object.__setattr__(self, "names", frozenset(self.names))
            for n in self.names:
                CheckpointKey(n, 0 if n in PER_LAYER_CHECKPOINTS else None).validate()
        if self.layers is not None:
            lo, hi = self.layers
            if lo < 0 or hi < lo:
                raise ConfigurationError(f"invalid layer range {self.layers!r}", hint="pass (start, stop) with 0 <= start <= stop")
            object.__setattr__(self, "layers", (int(lo), int(hi)))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple):
            return False
        key = CheckpointKey(*key)
        if self.names is not None and key.name not in self.names:
            return False
        if self.layers is not None and key.layer is not None:
            return self.layers[0] <= key.layer < self.layers[1]
        return True

    def keys(self, num_layers: int) -> list[CheckpointKey]:
        """The selected checkpoints of a model with ``num_layers`` layers, in execution order."""
        return [k for k in all_checkpoints(num_layers) if k in self]

    @classmethod
    def coerce(cls, taps: CheckpointSelection | Iterable[object] | None, num_layers: int) -> list[CheckpointKey]:
        """Turn ``None`` (everything), a selection, or an iterable of keys into an ordered key list."""
        if taps is None:
            return all_checkpoints(num_layers)
        if isinstance(taps, CheckpointSelection):
            return taps.keys(num_layers)
        wanted = {CheckpointKey.parse(t) for t in taps}
        for k in wanted:
            if k.layer is not None and k.layer >= num_layers:
                raise ConfigurationError(f"checkpoint {k} is beyond the model's {num_layers} layers", checkpoint=str(k))
        return [k for k in all_checkpoints(num_layers, range(num_layers)) if k in wanted]


@dataclass
class Capture(Mapping[CheckpointKey, "CapturedTensor"]):
    """What one backend run produced: ``CheckpointKey -> tensor`` plus timing.

    Tensors (torch tensors or NumPy arrays) stay on their device until compared.

    Attributes:
        tensors: the captured checkpoints, in execution order.
        backend: the backend's name.
        dtype: the compute dtype, as a string (``"float32"``).
        elapsed_s: wall time of the forward pass, seconds.
        layer_inputs: per layer index, the hidden state that entered the layer (when requested),
            so a single layer can be replayed from it.
        meta: what else the backend reports about this run (compile time, exported file, provider ...);
            JSON-ready values.
    """

    tensors: dict[CheckpointKey, CapturedTensor] = field(default_factory=dict)
    backend: str = ""
    dtype: str = ""
    elapsed_s: float = 0.0
    layer_inputs: dict[int, CapturedTensor] = field(default_factory=dict)
    meta: JsonObject = field(default_factory=dict)

    def __getitem__(self, key: CheckpointKey | tuple[str, int | None] | str) -> CapturedTensor:  # type: ignore[override]
        return self.tensors[CheckpointKey.parse(key)]

    def __iter__(self) -> Iterator[CheckpointKey]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, key: object) -> bool:
        try:
            return CheckpointKey.parse(key) in self.tensors  # type: ignore[arg-type]
        except (ConfigurationError, TypeError, ValueError):
            return False
