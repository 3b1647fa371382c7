"""Model positions: padded positions are not model outputs, so no metric or verdict reads them.

A batch of token sequences of unequal length is padded (on the right or the left) to one length,
and an attention mask says which positions hold tokens. What an implementation writes at a padded
position is not an output of the model: packed and paged engines leave those rows at zero, eager
frameworks compute values nobody reads. The comparison core therefore judges only the *model
positions* of a tensor whose leading dimensions are ``[batch, sequence]`` (or whose first
dimension is the ``batch x sequence`` tokens flattened, as a router's logits): :func:`select_positions`
keeps those rows (``[n_positions, ...]``), and ``compare(..., positions=mask)`` compares them alone
and reports the worst elements at their index in the full tensor.

A tensor whose leading dimensions are not the mask's (a pooled output, a scalar) is compared whole.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from ._inputs import is_tensor

__all__ = ["position_mask", "applies_to", "select_positions", "full_index"]

T = TypeVar("T")


def position_mask(mask: object) -> np.ndarray | None:
    """The boolean ``[batch, sequence]`` mask of model positions of an attention mask (non-zero =
    a token), or None when every position is a token (nothing to leave out) or ``mask`` is None."""
    if mask is None:
        return None
    arr = mask.detach().cpu().numpy() if is_tensor(mask) else np.asarray(mask)
    if arr.ndim != 2 or arr.size == 0:
        return None
    valid = arr != 0
    return None if bool(valid.all()) else np.ascontiguousarray(valid)


def _flat(shape: tuple[int, ...], positions: np.ndarray) -> bool:
    """The tensor's first dimension is the tokens flattened (``[batch x sequence, ...]``)."""
    return len(shape) >= 2 and tuple(shape[:2]) != tuple(positions.shape) and shape[0] == positions.size \
        and positions.shape[0] > 1


def applies_to(shape: tuple[int, ...], positions: np.ndarray | None) -> bool:
    """Whether a tensor of ``shape`` is one the mask selects rows of: its leading dimensions are the
    mask's ``[batch, sequence]``, or its first is the tokens flattened (``batch x sequence``)."""
    if positions is None or len(shape) < 2:
        return False
    return tuple(shape[:2]) == tuple(positions.shape) or _flat(shape, positions)


def select_positions(tensor: T, positions: np.ndarray | None) -> T:
    """The model positions of ``tensor`` (``[n_positions, ...]``) where :func:`applies_to` holds,
    else ``tensor`` itself (``positions``: boolean, or an attention mask). Torch tensors stay on their device; NumPy arrays stay NumPy."""
    if tensor is None or positions is None:
        return tensor
    if positions.dtype != np.bool_:  # an attention mask: its non-zero entries are the tokens
        positions = positions != 0
    shape = tuple(getattr(tensor, "shape", ()))
    if not applies_to(shape, positions):
        return tensor
    rows = positions.reshape(-1) if _flat(shape, positions) else positions
    if is_tensor(tensor):
        import torch

        return tensor[torch.from_numpy(rows).to(tensor.device)]
    return np.asarray(tensor)[rows]


def full_index(index: tuple[int, ...], positions: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in the full tensor (of ``shape``) of ``index`` in its :func:`select_positions` rows."""
    if not index:
        return index
    if _flat(shape, positions):
        return (int(np.flatnonzero(positions)[index[0]]), *index[1:])
    rows = np.argwhere(positions)  # [n_positions, 2], row-major like the boolean selection
    b, t = (int(v) for v in rows[index[0]])
    return (b, t, *index[1:])
