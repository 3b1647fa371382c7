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
from dataclasses import dataclass

import numpy as np

from ..jsonio import JsonObject
from .positions import full_index, select_positions
from .ratio import float64_array

__all__ = ["TokenFlip", "TokenMetrics", "next_token_metrics", "log_softmax", "TOP_K"]

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
    ref_full, alt_full = float64_array(reference), float64_array(alternative)
    if ref_full.shape != alt_full.shape or ref_full.ndim < 2:
        raise ValueError(f"logits must be [batch, (sequence,) vocab] of one shape, got {list(ref_full.shape)} "
                         f"and {list(alt_full.shape)}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
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
    overlap = np.array([len(set(r) & set(a)) for r, a in zip(ranked[:n], ranked[n:])], dtype=np.float64) / k
    overlap[bad] = 0.0
    dp = np.exp(shifted_q[rows, top_r] - lse_q[rows, 0]) - p[rows, top_r]
    dp[bad] = -p[bad, top_r[bad]]
    ref_energy = float(np.sum(ref * ref))
    # alt - ref is -d exactly (a rounded difference is antisymmetric), and its square d * d
    err_energy = math.inf if any_bad else float(np.sum(d * d))
    nmse = (0.0 if err_energy == 0 else math.inf) if ref_energy == 0 else err_energy / ref_energy
    flips = []
    for i in np.flatnonzero(flipped):
        j = int(order[i])
        index = tuple(int(v) for v in np.unravel_index(j, lead))
        if mask is not None:
            index = full_index(index, mask, ref_full.shape)[:2]
        flips.append(TokenFlip(index, int(top_r[i]), int(top_a[i]), float(gaps[i])))
    kl_max = float(np.max(kl))
    return TokenMetrics(
        positions=int(n),
        kl_divergence={"mean": float(np.mean(kl)), "p99": _p99(kl, kl_max), "max": kl_max},
        top1_agreement=float(1.0 - flipped.mean()), topk_overlap=float(overlap.mean()), k=int(k),
        delta_p={"mean": float(np.mean(dp)), "rms": float(np.sqrt(np.mean(dp * dp))),
                 "max_abs": float(np.max(np.abs(dp)))},
        logits_nmse=float(nmse), flips=tuple(flips))
