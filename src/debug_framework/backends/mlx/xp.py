"""The ``mlx.core`` array namespace the reference models run over in the ``mlx`` engine, registered
with :func:`debug_framework.architectures.xp.register_namespace` for MLX's arrays when this module
is imported (the engine's runner imports it)."""

from __future__ import annotations

import numpy as np

from ...architectures.xp import ArrayNamespace, register_namespace

__all__ = ["mlx_namespace"]

_MLX: list[ArrayNamespace] = []


def mlx_namespace() -> ArrayNamespace:
    """The ``mlx.core`` namespace (imports MLX; built once). Host data goes in as float32, MLX's
    widest float, and is then cast to the compute dtype."""
    if not _MLX:
        import mlx.core as mx

        _MLX.append(ArrayNamespace(
            name="mlx",
            dtype=lambda d: getattr(mx, d) if isinstance(d, str) else d,
            sqrt=mx.sqrt,
            exp=mx.exp,
            tanh=mx.tanh,
            erf=mx.erf,
            maximum=mx.maximum,
            where=mx.where,
            repeat=mx.repeat,
            concatenate=mx.concatenate,
            zeros_like=mx.zeros_like,
            lowest=lambda dtype: mx.array(mx.finfo(dtype).min, dtype),
            lower_triangle=lambda t, k=0: mx.tril(mx.ones((t, t), dtype=mx.bool_), k),
            host_dtype=lambda dtype: np.dtype(np.float32),
            from_host=lambda x, dtype: mx.array(np.asarray(x, np.float32)).astype(dtype),
            permute=mx.transpose,
            amax=lambda x, axis: mx.max(x, axis=axis, keepdims=True),
            sort=lambda x: mx.sort(x, axis=-1),
        ))
    return _MLX[0]


register_namespace("mlx", mlx_namespace)
