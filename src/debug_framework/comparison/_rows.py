"""Many small comparisons at once: every row of two stacked arrays measured in one fused pass (numba).

A decode step compares a few dozen small tensors (each checkpoint's new position, each layer's new
K/V entries); :func:`row_errors` folds, per row, what the batched comparison of
``services/validation/decode_batch.py`` reads, in one pass over the two stacks instead of a NumPy
temporary per metric. Every sum is NumPy's own: its pairwise summation (:func:`_pairwise`, the
algorithm of NumPy's ``add.reduce`` over a contiguous row, 8 accumulators over blocks of at most
128 elements, halves above), on the same element values (``d = x - y``, ``|d|``, ``d * d``, ...),
so every figure equals, to the last bit, the NumPy expression it replaces
(``tests/judgement/test_decode_batch.py`` checks it against them).
"""

from __future__ import annotations

import numpy as np

from ._kernel import _cached_njit

__all__ = ["row_errors", "ROW_SUMS"]

#: the columns of :func:`row_errors`'s sums, in order
ROW_SUMS = ("abs_error", "squared_error", "alternative_squares", "products", "rel_error", "max_rel_error",
            "mismatches", "gross_mismatches")

#: NumPy's pairwise summation block (``PW_BLOCKSIZE``)
_BLOCK = 128
#: the pairwise walk's stack depth: halves down to a block from any row length an int64 holds
_DEPTH = 128


@_cached_njit()
def _leaf(a: np.ndarray, start: int, n: int) -> float:  # pragma: no cover - compiled
    """NumPy's ``pairwise_sum`` of at most :data:`_BLOCK` elements ``a[start:start + n]``: one
    running sum below 8, else 8 accumulators and the rest added after them."""
    if n < 8:
        res = 0.0
        for i in range(start, start + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = 8
    end = n - (n % 8)
    while i < end:
        j = start + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[start + i]
        i += 1
    return res


@_cached_njit()
def _pairwise(a: np.ndarray, start: int, n: int, segments: np.ndarray,
              values: np.ndarray) -> float:  # pragma: no cover - compiled
    """``a[start:start + n]`` summed as NumPy's ``pairwise_sum`` sums a contiguous row: above
    :data:`_BLOCK` elements the sum of its two halves (the first a multiple of 8), each summed so.
    Walked with an explicit stack (numba's on-disk cache does not hold a recursive function):
    ``segments`` ``[depth, 3]`` and ``values`` ``[depth]`` its scratch."""
    if n <= _BLOCK:
        return _leaf(a, start, n)
    seg_start, seg_n, stage = segments[:, 0], segments[:, 1], segments[:, 2]
    top, held = 0, 0
    seg_start[0], seg_n[0], stage[0] = start, n, 0
    while top >= 0:
        s, k = seg_start[top], seg_n[top]
        if k <= _BLOCK:
            values[held] = _leaf(a, s, k)
            held += 1
            top -= 1
            continue
        half = k // 2
        half -= half % 8
        if stage[top] == 0:  # its first half next
            stage[top] = 1
            top += 1
            seg_start[top], seg_n[top], stage[top] = s, half, 0
        elif stage[top] == 1:  # then its second half
            stage[top] = 2
            top += 1
            seg_start[top], seg_n[top], stage[top] = s + half, k - half, 0
        else:  # both summed: their sum
            held -= 1
            values[held - 1] = values[held - 1] + values[held]
            top -= 1
    return values[0]


@_cached_njit()
def _fold(x: np.ndarray, y: np.ndarray, rtol: np.ndarray, atol: np.ndarray, gross: np.ndarray, eps: float,
          ad: np.ndarray, sums: np.ndarray, worst: np.ndarray, finite: np.ndarray) -> None:  # pragma: no cover
    """:func:`row_errors` into its outputs: per row one pass over the elements (each product kept
    for its pairwise sum), then the sums."""
    m, n = x.shape
    d2 = np.empty(n)
    x2 = np.empty(n)
    xy = np.empty(n)
    rel = np.empty(n)
    segments = np.empty((_DEPTH, 3), np.int64)
    values = np.empty(_DEPTH)
    for i in range(m):
        mism = 0
        gmism = 0
        at = 0
        top = -1.0
        max_rel = -np.inf
        ok = True  # (a finite row has no NaN: its maximum and its first largest need no NaN rule)
        for j in range(n):
            xv = x[i, j]
            yv = y[i, j]
            if not np.isfinite(xv):
                ok = False
            dv = xv - yv
            a = abs(dv)
            ad[i, j] = a
            d2[j] = dv * dv
            x2[j] = xv * xv
            xy[j] = xv * yv
            ay = abs(yv)
            r = a / (ay if ay >= eps else eps)
            rel[j] = r
            if r > max_rel:
                max_rel = r
            bound = atol[i] + rtol[i] * ay
            if a > bound:
                mism += 1
            if a > gross[i] * bound:
                gmism += 1
            if a > top:
                top = a
                at = j
        sums[i, 0] = 0.0 + _pairwise(ad[i], 0, n, segments, values)
        sums[i, 1] = 0.0 + _pairwise(d2, 0, n, segments, values)
        sums[i, 2] = 0.0 + _pairwise(x2, 0, n, segments, values)
        sums[i, 3] = 0.0 + _pairwise(xy, 0, n, segments, values)
        sums[i, 4] = 0.0 + _pairwise(rel, 0, n, segments, values)
        sums[i, 5] = max_rel
        sums[i, 6] = mism
        sums[i, 7] = gmism
        worst[i] = at
        finite[i] = ok


def row_errors(x: np.ndarray, y: np.ndarray, rtol: np.ndarray, atol: np.ndarray, gross: np.ndarray,
               eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row ``i`` of ``x`` (the other side) against row ``i`` of ``y`` (the reference), both
    ``[rows, n]`` float64, under the tolerance ``atol[i] + rtol[i] |y|`` (gross: ``gross[i]`` times
    it; ``eps``: the floor of ``|y|`` in the relative error). Returns ``|x - y|`` ``[rows, n]``, the
    sums ``[rows, len(ROW_SUMS)]`` (:data:`ROW_SUMS`: the sums of ``|d|``, ``d * d``, ``x * x``,
    ``x * y`` and the relative error, its maximum, the mismatches and gross mismatches), each row's
    first largest ``|d|`` and whether each row of ``x`` is all finite. A row of ``x`` or ``y`` with
    a non-finite value has figures that are not the NumPy expressions' (its caller compares it
    otherwise)."""
    rows, n = x.shape
    ad = np.empty((rows, n))
    sums = np.empty((rows, len(ROW_SUMS)))
    worst = np.empty(rows, np.int64)
    finite = np.empty(rows, np.bool_)
    _fold(np.ascontiguousarray(x), np.ascontiguousarray(y), rtol, atol, gross, float(eps), ad, sums, worst, finite)
    return ad, sums, worst, finite
