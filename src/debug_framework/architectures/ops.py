"""The few NumPy operations both reference models share."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["linear", "softmax", "erf", "masked_scores"]


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``x @ weight.T + bias``; weight is ``[out, in]`` as in ``torch.nn.Linear``."""
    y = x @ weight.T
    return y if bias is None else y + bias


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax."""
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def masked_scores(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Put the dtype's most negative value where ``allowed`` is False (as HF does, so a fully
    masked row becomes uniform instead of NaN)."""
    return np.where(allowed, scores, np.finfo(scores.dtype).min)


try:  # SciPy's erf is the C library's, vectorised; math.erf is the same function, one element at a time.
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - SciPy is optional
    _erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, exact to the C library's precision, in ``x``'s dtype."""
    return np.asarray(_erf(x), dtype=x.dtype)
