"""A ``transformers`` model's own eager attention, computed a block of query rows at a time.

Eager attention holds every score of a pass at once (``[batch, heads, queries, keys]``, three
times over: the products, the masked scores and their softmax): for a prefill of ``n`` tokens
that grows with ``n^2`` (a 1016-token prefill of a small model: about 100 MiB per row and layer).
The decode stage measures the calibration's noise at a late step with one prefill of every token
so far (:mod:`debug_framework.services.validation.decode_calibration`), so a long decode's peak
memory would be that prefill's. Each query row's attention reads only its own scores (a softmax
along the keys), so computing the rows :data:`QUERY_ROWS` at a time with the model's own eager
function is the same arithmetic holding ``QUERY_ROWS / n`` of the scores (a product over fewer rows
may take another BLAS kernel: a rounding apart, about 1e-7 relative in float32).

:func:`attention_in_row_blocks` switches a model whose attention modules dispatch through
``transformers``' attention interface (``config._attn_implementation``) and whose modeling modules
define ``eager_attention_forward`` to :data:`ROW_BLOCKS`, registered here with the eager mask; any
other model is left as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["QUERY_ROWS", "ROW_BLOCKS", "attention_in_row_blocks", "eager_in_row_blocks"]

#: query rows per block (a pass of at most this many tokens runs the eager function once)
QUERY_ROWS = 128
#: the attention implementation's registered name
ROW_BLOCKS = "debug_framework_eager_row_blocks"

_registered = False


def _eager_of(module: object) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None:
    """The eager attention function of ``module``'s modeling module, None where it has none."""
    found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return found if callable(found) else None


def eager_in_row_blocks(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The module's eager attention over :data:`QUERY_ROWS` query rows at a time (``query``
    ``[batch, heads, queries, dim]``; the output ``[batch, queries, heads, dim]`` as eager's): the
    attention function registered as :data:`ROW_BLOCKS`, and what another registered function that
    changes the operands first (an engine's emulation) calls."""
    import torch

    eager = _eager_of(module)
    if eager is None:
        raise TypeError(f"{type(module).__name__} has no eager_attention_forward in its module")
    n = query.shape[2]
    if n <= QUERY_ROWS:
        return eager(module, query, key, value, attention_mask, **kwargs)[0], None
    outs = []
    for start in range(0, n, QUERY_ROWS):
        rows = slice(start, start + QUERY_ROWS)
        mask = attention_mask if attention_mask is None or attention_mask.shape[2] == 1 else attention_mask[:, :, rows]
        outs.append(eager(module, query[:, :, rows], key, value, mask, **kwargs)[0])
    return torch.cat(outs, dim=1), None


def _register() -> bool:
    """Register :data:`ROW_BLOCKS` with ``transformers`` (once); False where it cannot be."""
    global _registered
    if _registered:
        return True
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError:
        return False
    AttentionInterface.register(ROW_BLOCKS, eager_in_row_blocks)
    AttentionMaskInterface.register(ROW_BLOCKS, eager_mask)
    _registered = True
    return True


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that dispatch attention through the interface (a ``config`` and a ``scaling``)."""
    return [m for m in model.modules() if hasattr(m, "scaling") and hasattr(getattr(m, "config", None), "_attn_implementation")]


def attention_in_row_blocks(model: torch.nn.Module) -> bool:
    """Switch ``model`` (built with ``attn_implementation="eager"``) to its eager attention in
    blocks of query rows where every attention module of it has an eager function to call; True
    where it was switched."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "eager":
        return False
    modules = _attention_modules(model)
    if not modules or any(_eager_of(m) is None for m in modules) or not _register():
        return False
    switch = getattr(model, "set_attn_implementation", None)
    if not callable(switch):
        return False
    try:
        switch(ROW_BLOCKS)
    except (ValueError, KeyError, TypeError):  # a model that refuses other implementations keeps eager
        return False
    if all(m.config._attn_implementation == ROW_BLOCKS for m in modules):
        return True
    switch("eager")  # a sub-model left out: all of it as it was
    return False
