"""Next-token distributions compared: the token-level view of two implementations' logits.

Two runs of a language model can differ by a tolerable amount everywhere and still choose other
tokens, or differ visibly in the logits while every token agrees. These metrics compare what the
model *predicts* at each judged position (each row's positions that hold tokens; padded positions
are left out, as everywhere in the comparison core), in float64:

* ``kl_divergence`` -- KL(P_ref || P_alt) of the softmax distributions, in nats: mean, p99 and max
  over the judged positions (llama.cpp's ``perplexity --kl-divergence`` reports the same);
* ``top1_agreement`` -- the fraction of positions whose argmax agrees; every position where it does
  not is a :class:`TokenFlip`, with the reference's logit gap between the two tokens (how close a
  tie the reference saw there);
* ``topk_overlap`` -- the mean of ``|top-k(ref) & top-k(alt)| / k`` (vLLM's logprob checks look at
  the top-k sets the same way);
* ``delta_p`` -- the alternative's probability of the reference's top token minus the reference's
  own (mean, RMS and the largest in absolute value);
* ``logits_nmse`` -- ``sum (alt - ref)^2 / sum ref^2`` over the judged positions.

    >>> import numpy as np
    >>> ref = np.array([[[2.0, 1.0, 0.0]]])
    >>> m = next_token_metrics(ref, ref, k=2)
    >>> m.kl_divergence["max"], m.top1_agreement, m.topk_overlap
    (0.0, 1.0, 1.0)
    >>> next_token_metrics(ref, ref[..., ::-1], k=1).flips[0].alternative_token
    2

Nothing here judges: the validation judge holds these against a correct run's at the
alternative's precision (docs/validation.md, "Token-level metrics").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..jsonio import JsonObject
from .positions import full_index, select_positions
from .ratio import float64_array

__all__ = ["TokenFlip", "TokenMetrics", "next_token_metrics", "next_token_metrics_many", "log_softmax", "TOP_K"]

#: the default ``k`` of the top-k overlap
TOP_K = 5


@dataclass(frozen=True)
class TokenFlip:
    """A position whose top-1 token differs: its index in the logits (``(row, position)``, or
    ``(row,)`` for ``[batch, vocab]`` logits), both tokens and the reference's logit gap between
    them (``ref[reference_token] - ref[alternative_token]`` >= 0: a near tie when small)."""

    index: tuple[int, ...]
    reference_token: int
    alternative_token: int
    reference_gap: float

    def to_dict(self) -> JsonObject:
        return {"index": list(self.index), "reference_token": self.reference_token,
                "alternative_token": self.alternative_token, "reference_gap": self.reference_gap}


@dataclass(frozen=True, slots=True)
class TokenMetrics:
    """The next-token distributions of two logits tensors compared over ``positions`` positions
    (see the module's docstring). ``flips`` lists every position whose top-1 differs, in order."""

    positions: int
    kl_divergence: dict[str, float]
    top1_agreement: float
    topk_overlap: float
    k: int
    delta_p: dict[str, float]
    logits_nmse: float
    flips: tuple[TokenFlip, ...] = ()

    def to_dict(self) -> JsonObject:
        """The JSON shape (docs/validation.md): the metrics, ``k``, ``positions`` and the flips."""
        return {"positions": self.positions, "kl_divergence": dict(self.kl_divergence),
                "top1_agreement": self.top1_agreement, "topk_overlap": self.topk_overlap, "k": self.k,
                "delta_p": dict(self.delta_p), "logits_nmse": self.logits_nmse,
                "flips": [f.to_dict() for f in self.flips]}

    @classmethod
    def empty(cls, k: int) -> TokenMetrics:
        """The metrics over no position (every figure NaN)."""
        nan = math.nan
        return cls(0, {"mean": nan, "p99": nan, "max": nan}, nan, nan, k, {"mean": nan, "rms": nan, "max_abs": nan}, nan)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of ``[n, vocab]`` logits in float64; a row with a non-finite logit
    becomes NaN."""
    shifted, lse = _shifted_lse(np.asarray(logits, dtype=np.float64))
    return shifted - lse


def _shifted_lse(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of ``x`` less its peak, and the log of the sum of its exponentials (``[n, 1]``):
    :func:`log_softmax` is their difference."""
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted, np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


#: up to this many positions the 99th percentile ``method="higher"`` is the largest value:
#: ``ceil(0.99 (n - 1)) = n - 1`` for n <= 100 (kept well inside that, away from rounding at the edge)
_P99_IS_MAX = 50


def _p99(values: np.ndarray, largest: float) -> float:
    """``np.quantile(values, 0.99, method="higher")``, ``largest`` (the maximum) where that is it."""
    if values.size <= _P99_IS_MAX:
        return largest
    return float(np.quantile(values, 0.99, method="higher"))


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest logits per row (ties: the lower index first): the rows'
    k-th largest found by a partition, only the candidates sorted (a whole vocabulary's sort is
    most of a decode step's token metrics)."""
    if k >= x.shape[-1] or np.isnan(x).any():
        return np.argsort(-x, axis=-1, kind="stable")[:, :k]
    kth = np.partition(x, x.shape[-1] - k, axis=-1)[:, x.shape[-1] - k]  # the k-th largest value
    out = np.empty((x.shape[0], k), np.int64)
    for i, row in enumerate(x):
        candidates = np.flatnonzero(row >= kth[i])  # ascending: a stable sort keeps ties' order
        if candidates.size > k:  # ties at the k-th: the lower indices among them
            above = np.flatnonzero(row > kth[i])
            candidates = np.concatenate([above, np.flatnonzero(row == kth[i])[:k - above.size]])
        out[i] = candidates[np.argsort(-row[candidates], kind="stable")]
    return out


def next_token_metrics(reference: object, alternative: object, positions: np.ndarray | None = None,
                       k: int = TOP_K) -> TokenMetrics:
    """Compare two logits tensors ``[batch, sequence, vocab]`` (or ``[batch, vocab]``) position by
    position: only the positions ``positions`` (a boolean ``[batch, sequence]`` mask, None: all)
    marks as tokens are judged.

    A position where the alternative has a non-finite logit counts as the worst disagreement:
    KL infinity, its top-1 a flip (gap infinity). Positions where the reference itself is
    non-finite are left out (nothing to predict from).

    Raises:
        ValueError: the shapes differ, a tensor has fewer than two dimensions, or ``k`` < 1.
    """
    ref_full, alt_full = _checked(reference, alternative, k)
    mask = positions if positions is not None and ref_full.ndim >= 3 else None
    ref = np.asarray(select_positions(ref_full, mask)).reshape(-1, ref_full.shape[-1])
    alt = np.asarray(select_positions(alt_full, mask)).reshape(-1, alt_full.shape[-1])
    lead = ref_full.shape[:-1] if mask is None else (int(mask.sum()),)
    order = np.arange(ref.shape[0])
    keep = np.isfinite(ref).all(axis=-1)
    if not bool(keep.all()):  # every row kept (the usual case): the arrays as they are
        ref, alt, order = ref[keep], alt[keep], order[keep]
    n, vocab = ref.shape
    k = min(k, vocab)
    if n == 0:
        return TokenMetrics.empty(k)
    rows = _row_figures(np.ascontiguousarray(ref), np.ascontiguousarray(alt), k)
    return _summary(rows, 0, n, k, order, lead, mask, ref_full.shape)


def next_token_metrics_many(pairs: Sequence[tuple[object, object]], k: int = TOP_K) -> list[TokenMetrics]:
    """:func:`next_token_metrics` of each pair of logits (every position judged), in order: the
    pairs of one shape whose reference is all finite (a decode step's logits, step after step)
    computed at once, each position's figures in one pass over their rows stacked, then each pair's
    summary over its own rows (each figure what the pair alone gives); the others one by one.

    Raises:
        ValueError: as :func:`next_token_metrics`.
    """
    out: list[TokenMetrics | None] = [None] * len(pairs)
    groups: dict[tuple[int, ...], list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for i, (reference, alternative) in enumerate(pairs):
        ref, alt = _checked(reference, alternative, k)
        if ref.size == 0 or not bool(np.isfinite(ref).all()):
            out[i] = next_token_metrics(ref, alt, k=k)
        else:
            groups.setdefault(ref.shape, []).append((i, ref, alt))
    for shape, members in groups.items():
        vocab = shape[-1]
        per = int(np.prod(shape[:-1]))
        ref = np.concatenate([r.reshape(-1, vocab) for _, r, _ in members])
        alt = np.concatenate([a.reshape(-1, vocab) for _, _, a in members])
        kk = min(k, vocab)
        rows = _row_figures(ref, alt, kk)
        order = np.arange(per)
        for j, (i, _, _) in enumerate(members):
            out[i] = _summary(rows, j * per, per, kk, order, shape[:-1], None, shape)
    return [m for m in out if m is not None]


def _checked(reference: object, alternative: object, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Both logits as float64 arrays of one shape, at least ``[batch, vocab]``.

    Raises:
        ValueError: the shapes differ, a tensor has fewer than two dimensions, or ``k`` < 1.
    """
    ref_full, alt_full = float64_array(reference), float64_array(alternative)
    if ref_full.shape != alt_full.shape or ref_full.ndim < 2:
        raise ValueError(f"logits must be [batch, (sequence,) vocab] of one shape, got {list(ref_full.shape)} "
                         f"and {list(alt_full.shape)}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return ref_full, alt_full


class _Rows(NamedTuple):
    """Each judged position's figures, rows of logits stacked (:func:`_row_figures`): the
    reference's logits, ``ref - alt`` (an alternative's non-finite row taken as zeros), whether the
    alternative's row is non-finite, the KL divergence, whether the top-1 flipped, both top-1
    tokens, the reference's gap between them, the top-k overlap and delta p."""

    ref: np.ndarray
    d: np.ndarray
    bad: np.ndarray
    kl: np.ndarray
    flipped: np.ndarray
    top_r: np.ndarray
    top_a: np.ndarray
    gaps: np.ndarray
    overlap: np.ndarray
    dp: np.ndarray


def _row_figures(ref: np.ndarray, alt: np.ndarray, k: int) -> _Rows:
    """The figures of each row of ``ref`` ``[n, vocab]`` (all finite) against the same row of
    ``alt``: every one a row's own (a row's reductions run over that row alone), so rows stacked
    from several pairs give each pair's figures."""
    n = ref.shape[0]
    bad = ~np.isfinite(alt).all(axis=-1)
    any_bad = bool(bad.any())
    alt_safe = np.where(bad[:, None], 0.0, alt) if any_bad else alt
    # both sides' rows at once (each row's reductions are its own: the same numbers as side by side)
    both = np.concatenate([ref, alt_safe])
    shifted, lse = _shifted_lse(both)
    log_p = shifted[:n] - lse[:n]
    shifted_q, lse_q = shifted[n:], lse[n:]
    p = np.exp(log_p)
    # KL = sum p (log p - log q). With d = ref - alt it is sum p d + log(sum p exp(-d)); for small d
    # the log is taken as log1p(sum p expm1(-d)), so a float32-sized d (KL ~ 1e-15) is not lost to
    # cancellation in float64; a large d (a real disagreement) takes the direct form (computed only
    # where a row takes it)
    d = ref - alt_safe
    with np.errstate(over="ignore", invalid="ignore"):
        fine = np.sum(p * d, axis=-1) + np.log1p(np.sum(p * np.expm1(-d), axis=-1))
    small = np.max(np.abs(d), axis=-1) < 1.0
    if bool(small.all()):
        kl = np.maximum(fine, 0.0)
    else:
        kl = np.maximum(np.where(small, fine, np.sum(p * (log_p - (shifted_q - lse_q)), axis=-1)), 0.0)
    kl[bad] = math.inf
    tops = np.argmax(both, axis=-1)
    top_r, top_a = tops[:n], tops[n:]
    flipped = (top_r != top_a) | bad
    rows = np.arange(n)
    gaps = ref[rows, top_r] - ref[rows, top_a]
    gaps[bad] = math.inf
    ranked = _top(both, k)
    # each row's top-k are k distinct tokens: the overlap counts the reference's found among the alternative's
    overlap = (ranked[:n, :, None] == ranked[n:, None, :]).any(axis=-1).sum(axis=-1) / k
    overlap[bad] = 0.0
    dp = np.exp(shifted_q[rows, top_r] - lse_q[rows, 0]) - p[rows, top_r]
    dp[bad] = -p[bad, top_r[bad]]
    return _Rows(ref, d, bad, kl, flipped, top_r, top_a, gaps, overlap, dp)


def _summary(rows: _Rows, start: int, n: int, k: int, order: np.ndarray, lead: tuple[int, ...],
             mask: np.ndarray | None, shape: tuple[int, ...]) -> TokenMetrics:
    """The metrics of rows ``start .. start + n`` of ``rows`` (one pair's positions: ``order[i]``
    the flat index of its row ``i`` among ``lead``, mapped through ``mask`` of logits ``shape``)."""
    end = start + n
    ref, d = rows.ref[start:end], rows.d[start:end]
    kl, flipped, dp = rows.kl[start:end], rows.flipped[start:end], rows.dp[start:end]
    ref_energy = float(np.sum(ref * ref))
    # alt - ref is -d exactly (a rounded difference is antisymmetric), and its square d * d
    err_energy = math.inf if bool(rows.bad[start:end].any()) else float(np.sum(d * d))
    nmse = (0.0 if err_energy == 0 else math.inf) if ref_energy == 0 else err_energy / ref_energy
    flips = []
    for i in np.flatnonzero(flipped):
        j = int(order[i])
        index = tuple(int(v) for v in np.unravel_index(j, lead))
        if mask is not None:
            index = full_index(index, mask, shape)[:2]
        flips.append(TokenFlip(index, int(rows.top_r[start + i]), int(rows.top_a[start + i]),
                               float(rows.gaps[start + i])))
    kl_max = float(np.max(kl))
    return TokenMetrics(
        positions=int(n),
        kl_divergence={"mean": float(np.mean(kl)), "p99": _p99(kl, kl_max), "max": kl_max},
        top1_agreement=float(1.0 - flipped.mean()), topk_overlap=float(rows.overlap[start:end].mean()), k=int(k),
        delta_p={"mean": float(np.mean(dp)), "rms": float(np.sqrt(np.mean(dp * dp))),
                 "max_abs": float(np.max(np.abs(dp)))},
        logits_nmse=float(nmse), flips=tuple(flips))
