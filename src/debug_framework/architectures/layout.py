"""Weight layouts: which checkpoint tensor feeds which parameter of a model, declared once per
family (``llama.LAYOUT``, ``bert.LAYOUT``) and read into any array namespace.

Parameters are plain names (``"q"``, ``"q_b"``, ``"input_norm"``); a module's bias is its
weight's name with ``_b``. No tensor is transposed or fused: ``ops.linear`` takes Hugging Face's
``[out, in]`` weights as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import ModelLoadingError
from .xp import Array, ArrayNamespace, DType

__all__ = ["WeightSource", "WeightLayout", "weight_and_bias", "Parameters"]

#: parameter name -> array (``None`` for an optional tensor the checkpoint lacks).
Parameters = dict[str, "Array | None"]


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

    def read(self, weights: WeightSource, num_layers: int, xp: ArrayNamespace, dtype: DType) -> tuple[Parameters, list[Parameters]]:
        """The model's parameters and each layer's, as ``xp`` arrays of ``dtype``."""
        host = xp.host_dtype(dtype)

        def get(param: str, name: str) -> Array | None:
            if name not in weights:
                if param in self.optional:
                    return None
                raise ModelLoadingError(f"the checkpoint has no tensor {name!r}", hint="is config.json the one of these weights?")
            data = weights.numpy(name, host) if hasattr(weights, "numpy") else weights[name]
            return xp.from_host(np.asarray(data, host), dtype)

        model = {p: get(p, name) for p, name in self.model.items()}
        layers = []
        for i in range(num_layers):
            prefix = self.layer_prefix.format(i=i)
            layers.append({p: get(p, prefix + name) for p, name in self.layer.items()})
        return model, layers
