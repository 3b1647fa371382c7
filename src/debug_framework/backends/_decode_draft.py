"""A reference's greedy decode several steps to a pass (speculative decoding's check).

A decode step of a small model costs its Python far more than its arithmetic: a pass over eight
new tokens costs about what a pass over one does. A greedy decode cannot feed tokens it has not
chosen yet, so a *draft* proposes them: a float32 copy of the same model (:class:`GreedyDraft`),
decoding greedily from its own cache, with no capture and no float64 exactness. The reference
then runs one pass over the certain next token and the draft's proposals, and its own greedy
choice after each token says how many of them it would have fed itself: those steps are its
steps (each one's checkpoints, cache and logits cut from the pass), the rest of the pass is
dropped from its cache (:func:`crop_cache`), and the next pass starts from its own choice. The
tokens, and every tensor of a step, are the reference's own: the draft decides only how many
steps one pass computes (docs/validation.md, "Decode steps").

Where another side chooses the tokens (the alternative leads: docs/validation.md, "Decode
steps"), they come from a :class:`TokenFeed` as that side chooses them: the decode feeds as many as
are known (up to :data:`~.decode.CHUNK_STEPS`) in one pass, no draft needed, every one of them
kept, and records after each pass the token its own greedy choice would have fed next
(``Capture.meta["choice"]``), so that the side feeding it can tell where it chose another.

Only a cache whose every layer is ``transformers``' plain ``DynamicLayer`` (every position kept,
appended in order) is cut this way (:func:`plain_cache`): a sliding window's or a quantised
cache's layers are decoded a step at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from ..capture.keys import CheckpointKey
from ..errors import BackendRuntimeError

if TYPE_CHECKING:
    import torch

    from .base import Tensor

__all__ = ["GreedyDraft", "TokenFeed", "plain_cache", "crop_cache", "cache_length", "accepted", "fed_column",
           "step_of"]


@runtime_checkable
class TokenFeed(Protocol):
    """The tokens of a teacher-forced decode as another side chooses them (in another process)."""

    def known(self, start: int, most: int) -> np.ndarray:
        """``[batch, n]`` int64, ``1 <= n <= most``: the tokens fed at decode steps ``start + 1``
        to ``start + n``, waiting until ``most`` of them are known (fewer only where the feed ends).

        Raises:
            EOFError: the feed ended before the token of step ``start + 1``.
        """
        ...


def fed_column(tokens: np.ndarray | TokenFeed, s: int) -> np.ndarray:
    """``[batch]`` int64: the token fed at decode step ``s + 1`` (``tokens[:, s]``, or waited for
    from a :class:`TokenFeed`)."""
    if isinstance(tokens, TokenFeed):
        return np.asarray(tokens.known(s, 1), np.int64)[:, 0]
    return np.asarray(tokens, np.int64)[:, s]


def _layers(cache: object) -> list[object]:
    return list(getattr(cache, "layers", None) or [])


def plain_cache(cache: object) -> bool:
    """Whether every layer of a ``transformers`` cache keeps every position in order and can be
    cut back (``DynamicLayer`` itself, not a sliding, indexed or quantised subclass)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return False
    layers = _layers(cache)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers) and hasattr(cache, "crop")


def cache_length(cache: object) -> int:
    """The positions a plain cache holds (its first layer's)."""
    keys = getattr(_layers(cache)[0], "keys", None)
    return 0 if keys is None or keys.dim() < 2 else int(keys.shape[-2])


def crop_cache(cache: object, drop: int) -> None:
    """Drop a plain cache's last ``drop`` positions (every layer)."""
    if drop > 0:
        cache.crop(-drop)  # type: ignore[attr-defined]


def accepted(fed: np.ndarray, choice: np.ndarray) -> int:
    """How many of a pass's ``fed`` tokens ``[batch, n]`` a greedy decode feeds itself: the first
    (certain), then each next one as long as every row's greedy ``choice`` ``[batch, n]`` after the
    token before it is that token."""
    n = fed.shape[1]
    m = 1
    while m < n and np.array_equal(choice[:, m - 1], fed[:, m]):
        m += 1
    return m


class GreedyDraft:
    """A copy of the model proposing a greedy decode's next tokens from a cache of its own.

    ``module`` is the copy (float32), ``kwargs`` the prefill's forward arguments (``input_ids``,
    ``attention_mask``), ``cache_arg`` the forward's cache argument, ``offset`` the rows' first
    position. :meth:`propose` first catches up with the tokens the decode has fed (dropping from
    its cache what it had proposed beyond them).

    Raises:
        ValueError: the copy's cache is not a plain one (:func:`plain_cache`).
    """

    def __init__(self, module: torch.nn.Module, kwargs: dict[str, torch.Tensor], cache_arg: str, offset: int) -> None:
        import torch

        self.module, self.cache_arg, self.offset = module, cache_arg, offset
        self.mask = kwargs["attention_mask"].detach().cpu().numpy().astype(np.int64)
        with torch.inference_mode():
            out = module(**kwargs, use_cache=True)
        self.cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)  # as decode._cache_of
        if not plain_cache(self.cache):
            raise ValueError("the draft's cache is not a plain DynamicCache")
        #: the tokens fed after the prefill, ``[batch]`` each, in order
        self.fed: list[np.ndarray] = []
        self._same = 0  #: how many of :attr:`fed` are known to be the decode's own

    def propose(self, fed: Sequence[np.ndarray], n: int) -> np.ndarray:
        """``[batch, n]``: the draft's greedy tokens after the decode's ``fed`` tokens (``[batch]``
        each, every token fed after the prefill and the certain next one)."""
        import torch

        common = min(self._same, len(fed))  # the decode's fed tokens never change: only the newer are checked
        while common < min(len(self.fed), len(fed)) and np.array_equal(self.fed[common], fed[common]):
            common += 1
        crop_cache(self.cache, len(self.fed) - common)
        del self.fed[common:]
        feed = np.stack(list(fed[common:]), axis=1)
        self._same = len(fed)
        out: list[np.ndarray] = []
        with torch.inference_mode():
            for _ in range(n):
                fed_mask = np.concatenate([self.mask, np.ones((self.mask.shape[0], len(self.fed)), np.int64)], axis=1)
                mask = np.concatenate([fed_mask, np.ones(feed.shape, np.int64)], axis=1)
                # as decode.decode_positions (not imported: that module imports this one)
                positions = self.offset + (fed_mask != 0).sum(axis=1, keepdims=True) + np.arange(feed.shape[1])
                got = self.module(input_ids=torch.from_numpy(feed), attention_mask=torch.from_numpy(mask),
                                  position_ids=torch.from_numpy(positions), **{self.cache_arg: self.cache},
                                  use_cache=True)
                self.fed.extend(feed.T.copy())
                nxt = got.logits[:, -1].float().argmax(-1).numpy().astype(np.int64)
                out.append(nxt)
                feed = nxt[:, None]
        return np.stack(out, axis=1)


def step_of(backend_name: str, key: CheckpointKey, t: Tensor, batch: int, n: int, j: int) -> Tensor:
    """Step ``j``'s part of a checkpoint a pass of ``n`` tokens per row returned: ``[batch, n, ...]``
    cut to ``[batch, 1, ...]``, or the tokens flattened ``[batch * n, ...]`` (a router's logits) cut
    to ``[batch, ...]``, as a one-token step returns each (copied: no view of the pass's tensor kept).

    Raises:
        BackendRuntimeError: (DF005) a tensor of neither layout.
    """
    shape = tuple(getattr(t, "shape", ()))
    if len(shape) >= 2 and shape[:2] == (batch, n):
        part = t[:, j:j + 1]
    elif len(shape) >= 1 and shape[0] == batch * n:
        part = t.reshape(batch, n, *shape[1:])[:, j]
    else:
        raise BackendRuntimeError(f"decode_steps() returned {key} of shape {list(shape)}, neither [batch, tokens, ...] "
                                  f"nor [batch x tokens, ...] for {batch} row(s) of {n} token(s)",
                                  backend=backend_name, call="decode_steps()",
                                  hint="return each checkpoint per row and token, as prefill() does")
    clone = getattr(part, "clone", None)
    return clone() if callable(clone) else np.array(part)
