"""Next-token distributions compared when one side gives only its top-k log-probabilities (a
served model): the same :class:`~.next_token.TokenMetrics` as :func:`~.next_token.next_token_metrics`,
from the reference's full logits and the other side's top-k ids and log-probabilities, position by
position, in float64:

* ``kl_divergence`` -- KL(P_ref || P_alt) over the alternative's returned top-k tokens, both
  distributions renormalised over those tokens (the conditional distributions on that set: exact
  where the top-k holds the whole mass, a lower bound on the full KL otherwise);
* ``top1_agreement`` -- the alternative's most likely returned token is the reference's argmax;
  every other position is a :class:`~.next_token.TokenFlip` with the reference's logit gap;
* ``topk_overlap`` -- ``|top-k(ref) & returned| / k``;
* ``delta_p`` -- the alternative's probability of the reference's argmax minus the reference's own
  (where the token is not among those returned, the smallest returned probability: its upper bound);
* ``logits_nmse`` -- NaN: the logits are not given out.

    >>> import numpy as np
    >>> ref = np.log(np.array([[0.5, 0.3, 0.2]]))
    >>> m = topk_token_metrics(ref, np.array([[0, 1]]), np.log(np.array([[0.5, 0.3]])), [(0, 0)])
    >>> round(m.kl_divergence["max"], 12), m.top1_agreement, m.topk_overlap
    (0.0, 1.0, 1.0)

:func:`log_probs_at` gives a full-logits side's log-probabilities at the returned ids: what the
judge's calibrated rule compares the returned log-probabilities with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .next_token import TokenFlip, TokenMetrics, log_softmax

__all__ = ["topk_token_metrics", "log_softmax", "log_probs_at", "top_of"]


def log_probs_at(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The log-probabilities ``[n, k]`` of ``[n, vocab]`` logits at the token ids ``[n, k]``."""
    return np.take_along_axis(log_softmax(logits), np.asarray(ids, dtype=np.int64), axis=-1)


def top_of(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, log-probabilities)`` of the ``k`` most likely tokens of each row of ``[n, vocab]``
    logits, most likely first: what a server returning the top-k would return for them."""
    lp = log_softmax(logits)
    ids = np.argsort(-lp, axis=-1, kind="stable")[:, :k]
    return ids, np.take_along_axis(lp, ids, axis=-1)


def _conditional_kl(ref_lp: np.ndarray, alt_lp: np.ndarray) -> np.ndarray:
    """KL of the two distributions renormalised over the same tokens, per row; ``ref_lp`` and
    ``alt_lp`` ``[n, k]`` log-probabilities. For a small difference it is taken as ``sum p d +
    log1p(sum p expm1(-d))`` (``d = ref - alt``), so a float32-sized difference is not lost."""
    p = np.exp(ref_lp - np.max(ref_lp, axis=-1, keepdims=True))
    p /= np.sum(p, axis=-1, keepdims=True)
    d = ref_lp - alt_lp
    with np.errstate(over="ignore", invalid="ignore"):
        fine = np.sum(p * d, axis=-1) + np.log1p(np.sum(p * np.expm1(-d), axis=-1))
        q = np.exp(alt_lp - np.max(alt_lp, axis=-1, keepdims=True))
        q /= np.sum(q, axis=-1, keepdims=True)
        direct = np.sum(np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0), axis=-1)
    return np.maximum(np.where(np.max(np.abs(d), axis=-1) < 1.0, fine, direct), 0.0)


def topk_token_metrics(reference: np.ndarray, ids: np.ndarray, logprobs: np.ndarray,
                       index: Sequence[tuple[int, ...]]) -> TokenMetrics:
    """Compare reference logits ``[n, vocab]`` with another side's top-k ``ids`` and ``logprobs``
    ``[n, k]`` (most likely first), position by position; ``index[i]`` names position ``i`` in the
    flips (``(row, position)`` or ``(row,)``). A position whose returned log-probabilities are not
    finite counts as the worst disagreement (KL infinity, a flip)."""
    ref = np.asarray(reference, dtype=np.float64).reshape(-1, np.shape(reference)[-1])
    ids = np.asarray(ids, dtype=np.int64).reshape(ref.shape[0], -1)
    alt = np.asarray(logprobs, dtype=np.float64).reshape(ids.shape)
    n, k = ids.shape
    if n == 0:
        return TokenMetrics.empty(k)
    bad = ~np.isfinite(alt).all(axis=-1)
    alt_safe = np.where(bad[:, None], 0.0, alt)
    ref_lp = log_softmax(ref)
    at = np.take_along_axis(ref_lp, ids, axis=-1)
    kl = _conditional_kl(at, alt_safe)
    kl[bad] = math.inf
    rows = np.arange(n)
    top_r = np.argmax(ref, axis=-1)
    top_a = ids[rows, np.argmax(alt_safe, axis=-1)]
    flipped = (top_r != top_a) | bad
    gaps = ref[rows, top_r] - ref[rows, top_a]
    gaps[bad] = math.inf
    ref_top = np.argsort(-ref, axis=-1, kind="stable")[:, :k]
    overlap = np.array([len(set(r) & set(a)) for r, a in zip(ref_top, ids)], dtype=np.float64) / k
    overlap[bad] = 0.0
    hit = ids == top_r[:, None]
    q = np.where(hit.any(axis=-1), np.exp(np.where(hit, alt_safe, -np.inf)).max(axis=-1), np.exp(alt_safe.min(axis=-1)))
    dp = q - np.exp(ref_lp[rows, top_r])
    dp[bad] = -np.exp(ref_lp[bad, top_r[bad]])
    flips = tuple(TokenFlip(tuple(int(v) for v in index[i]), int(top_r[i]), int(top_a[i]), float(gaps[i]))
                  for i in np.flatnonzero(flipped))
    return TokenMetrics(
        positions=int(n),
        kl_divergence={"mean": float(np.mean(kl)), "p99": float(np.quantile(kl, 0.99, method="higher")),
                       "max": float(np.max(kl))},
        top1_agreement=float(1.0 - flipped.mean()), topk_overlap=float(overlap.mean()), k=int(k),
        delta_p={"mean": float(np.mean(dp)), "rms": float(np.sqrt(np.mean(dp * dp))), "max_abs": float(np.max(np.abs(dp)))},
        logits_nmse=math.nan, flips=flips)
