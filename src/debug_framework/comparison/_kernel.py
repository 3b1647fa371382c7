"""The fused single-pass comparison kernel (CPU, numba).

One call streams over a pair of flat arrays and folds every metric into a small state:
sums in float64, counts, the max ULP distance, a log-bucketed histogram of absolute errors (for
quantiles) and the k worst elements. Work is split across threads in contiguous ranges; each range
is walked in cache-sized blocks so the histogram and top-k passes re-read data from L1/L2, not RAM.

Extra memory is O(threads x (histogram + k)), independent of the input size.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
from numba import njit, prange

# --- state layout -------------------------------------------------------------------------------
# float64 sums / maxima
F_SUM_AD, F_SUM_D2, F_SUM_R2, F_SUM_A2, F_SUM_AR, F_SUM_REL, F_MAX_REL = range(7)
NF = 7
# int64 counts
(
    I_FINITE,  # pairs where both sides are finite (the population of the error statistics)
    I_MISMATCH,  # pairs outside atol + rtol*|ref| (non-finite mismatches included)
    I_GROSS,  # pairs outside outlier_factor * (atol + rtol*|ref|) (non-finite mismatches included)
    I_NAN_A,
    I_NAN_R,
    I_POSINF_A,
    I_NEGINF_A,
    I_POSINF_R,
    I_NEGINF_R,
    I_FIRST_NONFINITE,  # flat index, or -1
    I_NONFINITE_MISMATCH,
) = range(11)
NI = 11

#: Histogram buckets: the top 16 bits of a non-negative float64 (11 exponent bits + 4 mantissa bits),
#: i.e. log-spaced buckets of relative width 1/16.
HIST_SHIFT = 48
HIST_BUCKETS = 1 << 15

_BLOCK = 2048
_MIN_PER_THREAD = 1 << 16
_PARTS_PER_THREAD = 8


@njit(cache=True)
def _topk_insert(tv, ti, key, idx):
    # replace the current minimum; return the new minimum
    k = tv.shape[0]
    pos = 0
    for j in range(1, k):
        if tv[j] < tv[pos]:
            pos = j
    tv[pos] = key
    ti[pos] = idx
    m = tv[0]
    for j in range(1, k):
        if tv[j] < m:
            m = tv[j]
    return m


@njit(cache=True)
def _block_max_bits(bits, m, cur):
    # Max of non-negative, non-NaN float64 values through their int64 bit patterns, which order
    # the same way; an integer max reduction vectorises where a float one (NaN rules) does not.
    for jj in range(m):
        v = bits[np.uint64(jj)]
        cur = v if v > cur else cur
    return cur


@njit(cache=True, fastmath={"reassoc"}, error_model="numpy")
def _range_pass(a, r, ai, ri, mask, lo, hi, base, rtol, atol, gross_factor, rel_eps, equal_nan,
                fs, cnt, hist, ulp, tv, ti, nfi):
    # Indices are unsigned throughout: numba then skips its negative-index wrap-around check,
    # which otherwise stops LLVM from vectorising the loops (3 GB/s -> 11+ GB/s).
    buf = np.empty(_BLOCK, np.float64)
    rbuf = np.empty(_BLOCK, np.float64)
    rbits = rbuf.view(np.int64)
    h2 = np.zeros((2, HIST_BUCKETS + 1), np.int64)  # last bucket: non-finite (discarded)
    keys = np.empty(_BLOCK, np.uint32)
    ubuf = np.empty(_BLOCK, np.float64)
    ubits = ubuf.view(np.int64)
    bufi = buf.view(np.int64)
    use_ulp = mask != 0
    thr = tv[0]
    for j in range(1, tv.shape[0]):
        if tv[j] < thr:
            thr = tv[j]
    s_ad = 0.0
    s_d2 = 0.0
    s_r2 = 0.0
    s_a2 = 0.0
    s_ar = 0.0
    s_rel = 0.0
    m_rel_bits = np.array([fs[F_MAX_REL]]).view(np.int64)[0]
    m_ulp_bits = np.array([np.float64(ulp[0])]).view(np.int64)[0]
    n_fin = 0
    n_mis = 0
    n_gross = 0
    i0 = lo
    while i0 < hi:
        m = min(_BLOCK, hi - i0)
        u0 = np.uint64(i0)
        fin_before = n_fin
        # pass 1: arithmetic over the block, branch-free so it vectorises; non-finite pairs are
        # zeroed here and handled in the rare path below. ULP distance of same-sign values is the
        # difference of their bit patterns; of opposite-sign values, the sum of their magnitudes.
        for jj in range(m):
            j = np.uint64(jj)
            x = np.float64(a[u0 + j])
            y = np.float64(r[u0 + j])
            fin = (x - x == 0.0) & (y - y == 0.0)
            x = x if fin else 0.0
            y = y if fin else 0.0
            d = x - y
            ad = abs(d)
            ay = abs(y)
            s_ad += ad
            s_d2 += d * d
            s_r2 += y * y
            s_a2 += x * x
            s_ar += x * y
            bound = atol + rtol * ay
            n_mis += np.int64(ad > bound)
            n_gross += np.int64(ad > gross_factor * bound)
            rel = ad / (ay if ay > rel_eps else rel_eps)
            s_rel += rel
            rbuf[j] = rel
            n_fin += np.int64(fin)
            buf[j] = ad if fin else -1.0
            if use_ulp:
                ia = np.int64(ai[u0 + j])
                ir = np.int64(ri[u0 + j])
                dd = ia - ir
                u = np.float64(dd if dd >= 0 else -dd) if (ia ^ ir) >= 0 else np.float64(ia & mask) + np.float64(ir & mask)
                ubuf[j] = u if fin else 0.0
        m_rel_bits = _block_max_bits(rbits, m, m_rel_bits)
        if use_ulp:
            m_ulp_bits = _block_max_bits(ubits, m, m_ulp_bits)
        nonfinite_in_block = m - (n_fin - fin_before)
        # pass 2: histogram of the block's absolute errors; keys first (vectorised), then a tight
        # scatter into two interleaved sub-histograms (repeated hits on one bucket would otherwise
        # serialise on store-to-load forwarding)
        for jj in range(m):
            j = np.uint64(jj)
            keys[j] = np.uint32(bufi[j] >> HIST_SHIFT) if buf[j] >= 0.0 else np.uint32(HIST_BUCKETS)
        for jj in range(0, m - 1, 2):
            j = np.uint64(jj)
            h2[0, keys[j]] += 1
            h2[1, keys[j + np.uint64(1)]] += 1
        if m & 1:
            h2[0, keys[np.uint64(m - 1)]] += 1
        # pass 3: k worst finite elements (the first of them is the max absolute error)
        # (skipped unless the block's max beats the current k-th worst: after warm-up, most blocks)
        if _block_max_bits(bufi, m, np.int64(-1)) > np.array([thr]).view(np.int64)[0] or thr < 0.0:
            for jj in range(m):
                j = np.uint64(jj)
                if buf[j] > thr:
                    thr = _topk_insert(tv, ti, buf[j], base + i0 + jj)
        # rare path: non-finite pairs
        if nonfinite_in_block:
            for jj in range(m):
                j = np.uint64(jj)
                if buf[j] >= 0.0:
                    continue
                x = np.float64(a[u0 + j])
                y = np.float64(r[u0 + j])
                xa = x != x
                yr = y != y
                if xa:
                    cnt[I_NAN_A] += 1
                elif x - x != 0.0:
                    if x > 0:
                        cnt[I_POSINF_A] += 1
                    else:
                        cnt[I_NEGINF_A] += 1
                if yr:
                    cnt[I_NAN_R] += 1
                elif y - y != 0.0:
                    if y > 0:
                        cnt[I_POSINF_R] += 1
                    else:
                        cnt[I_NEGINF_R] += 1
                flat = base + i0 + jj
                if cnt[I_FIRST_NONFINITE] < 0 or flat < cnt[I_FIRST_NONFINITE]:
                    cnt[I_FIRST_NONFINITE] = flat
                if xa and yr:
                    match = equal_nan
                elif (not xa) and (not yr) and x == y:
                    match = True
                else:
                    match = False
                if not match:
                    n_mis += 1
                    n_gross += 1
                    # keep the k smallest flat indices (parts may arrive in any order)
                    c = cnt[I_NONFINITE_MISMATCH]
                    if c < nfi.shape[0]:
                        nfi[c] = flat
                    else:
                        pos = 0
                        for q in range(1, nfi.shape[0]):
                            if nfi[q] > nfi[pos]:
                                pos = q
                        if flat < nfi[pos]:
                            nfi[pos] = flat
                    cnt[I_NONFINITE_MISMATCH] = c + 1
        i0 += m
    fs[F_SUM_AD] += s_ad
    fs[F_SUM_D2] += s_d2
    fs[F_SUM_R2] += s_r2
    fs[F_SUM_A2] += s_a2
    fs[F_SUM_AR] += s_ar
    fs[F_SUM_REL] += s_rel
    fs[F_MAX_REL] = np.array([m_rel_bits]).view(np.float64)[0]
    ulp[0] = max(ulp[0], np.uint64(np.array([m_ulp_bits]).view(np.float64)[0]))
    for b in range(HIST_BUCKETS):
        hist[b] += h2[0, b] + h2[1, b]
    cnt[I_FINITE] += n_fin
    cnt[I_MISMATCH] += n_mis
    cnt[I_GROSS] += n_gross


@njit(cache=True)
def _partials(nt, fs, tv, nfi):
    """Empty partial states for ``nt`` workers (first axis), in the order ``_range_pass`` takes them."""
    k = tv.shape[0]
    pfs = np.zeros((nt, NF), np.float64)
    pcnt = np.zeros((nt, NI), np.int64)
    phist = np.zeros((nt, HIST_BUCKETS), np.int64)
    pulp = np.zeros((nt, 1), np.uint64)
    ptv = np.full((nt, k), -1.0)
    pti = np.full((nt, k), -1, np.int64)
    pnfi = np.full((nt, nfi.shape[0]), -1, np.int64)
    for t in range(nt):
        pcnt[t, I_FIRST_NONFINITE] = -1
        pfs[t, F_MAX_REL] = fs[F_MAX_REL]
    return pfs, pcnt, phist, pulp, ptv, pti, pnfi


@njit(cache=True, parallel=True, error_model="numpy")
def accumulate(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan,
               fs, cnt, hist, ulp, tv, ti, nfi, nthreads):
    """Fold the pair (a, r) (flat, same length) into the state arrays.

    ``ai``/``ri`` are integer views of the values in the dtype whose ULPs are measured (``mask`` is
    that dtype's magnitude mask; 0 disables ULP). ``base`` is the flat index of ``a[0]``.
    """
    n = a.shape[0]
    # Work is cut into parts handed out dynamically (the caller sets chunk size 1), so one thread
    # stalled by another process does not hold the others up; partial state is per worker thread.
    parts = max(1, min(nthreads * _PARTS_PER_THREAD, n // _MIN_PER_THREAD))
    pfs, pcnt, phist, pulp, ptv, pti, pnfi = _partials(nthreads, fs, tv, nfi)
    for p in prange(parts):
        t = numba.get_thread_id()
        lo = n * p // parts
        hi = n * (p + 1) // parts
        _range_pass(a, r, ai, ri, mask, lo, hi, base, rtol, atol, gross_factor, rel_eps, equal_nan,
                    pfs[t], pcnt[t], phist[t], pulp[t], ptv[t], pti[t], pnfi[t])
    _merge(fs, cnt, hist, ulp, tv, ti, nfi, pfs, pcnt, phist, pulp, ptv, pti, pnfi)


@njit(cache=True, error_model="numpy")
def accumulate_serial(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan,
                      fs, cnt, hist, ulp, tv, ti, nfi):
    """:func:`accumulate` in the calling thread, for inputs too small to split (one part): the
    same pass over the same single range, so the same state, without a parallel launch."""
    pfs, pcnt, phist, pulp, ptv, pti, pnfi = _partials(1, fs, tv, nfi)
    _range_pass(a, r, ai, ri, mask, 0, a.shape[0], base, rtol, atol, gross_factor, rel_eps, equal_nan,
                pfs[0], pcnt[0], phist[0], pulp[0], ptv[0], pti[0], pnfi[0])
    _merge(fs, cnt, hist, ulp, tv, ti, nfi, pfs, pcnt, phist, pulp, ptv, pti, pnfi)


@njit(cache=True, error_model="numpy")
def _merge(fs, cnt, hist, ulp, tv, ti, nfi, pfs, pcnt, phist, pulp, ptv, pti, pnfi):
    """Fold the per-thread partial states (first axis) into the state."""
    nt = pfs.shape[0]
    k = tv.shape[0]
    for t in range(nt):
        for f in (F_SUM_AD, F_SUM_D2, F_SUM_R2, F_SUM_A2, F_SUM_AR, F_SUM_REL):
            fs[f] += pfs[t, f]
        if pulp[t, 0] > ulp[0]:
            ulp[0] = pulp[t, 0]
        for f in (F_MAX_REL,):
            if pfs[t, f] > fs[f]:
                fs[f] = pfs[t, f]
        for c in range(NI):
            if c == I_FIRST_NONFINITE:
                v = pcnt[t, c]
                if v >= 0 and (cnt[c] < 0 or v < cnt[c]):
                    cnt[c] = v
            else:
                cnt[c] += pcnt[t, c]
        for b in range(HIST_BUCKETS):
            hist[b] += phist[t, b]
        # merge top-k
        thr = tv[0]
        for j in range(1, k):
            if tv[j] < thr:
                thr = tv[j]
        for j in range(k):
            if pti[t, j] >= 0 and ptv[t, j] > thr:
                thr = _topk_insert(tv, ti, ptv[t, j], pti[t, j])
    # first non-finite mismatches: the smallest flat indices over all threads and earlier calls
    kk = nfi.shape[0]
    allv = np.empty(kk * (nt + 1), np.int64)
    na = 0
    for j in range(kk):
        if nfi[j] >= 0:
            allv[na] = nfi[j]
            na += 1
    for t in range(nt):
        for j in range(kk):
            if pnfi[t, j] >= 0:
                allv[na] = pnfi[t, j]
                na += 1
    srt = np.sort(allv[:na])
    for j in range(kk):
        nfi[j] = srt[j] if j < na else -1


def new_state(k: int) -> tuple[np.ndarray, ...]:
    fs = np.zeros(NF, np.float64)
    cnt = np.zeros(NI, np.int64)
    cnt[I_FIRST_NONFINITE] = -1
    hist = np.zeros(HIST_BUCKETS, np.int64)
    ulp = np.zeros(1, np.uint64)
    tv = np.full(max(k, 1), -1.0)
    ti = np.full(max(k, 1), -1, np.int64)
    nfi = np.full(max(k, 1), -1, np.int64)
    return fs, cnt, hist, ulp, tv, ti, nfi


def num_threads() -> int:
    return int(numba.get_num_threads())


def fold(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, state) -> None:
    """Python entry: :func:`accumulate` with dynamic scheduling over all numba threads; an input
    too small to split (one part) is folded in the calling thread instead, since launching the
    thread team costs far more than the pass (tens of ms on a loaded machine, or with many
    Python threads comparing at once, against microseconds)."""
    if a.shape[0] < 2 * _MIN_PER_THREAD:  # accumulate would make a single part
        accumulate_serial(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, *state)
        return
    global _serialize_launches
    if _serialize_launches is False:
        with numba.parallel_chunksize(1):
            accumulate(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, *state, num_threads())
        return
    with _launch_lock:
        with numba.parallel_chunksize(1):
            accumulate(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, *state, num_threads())
        if _serialize_launches is None:
            _serialize_launches = numba.threading_layer() not in _THREADSAFE_LAYERS


#: numba's threading layers that take parallel launches from several Python threads at once. The
#: ``workqueue`` layer (chosen when neither TBB nor OpenMP is there, e.g. macOS wheels without
#: libomp) aborts the whole process on a concurrent launch, so launches are then serialised; which
#: layer numba picked is known only after its first launch, which is therefore serialised too.
_THREADSAFE_LAYERS = ("tbb", "omp")
_launch_lock = threading.Lock()
_serialize_launches: bool | None = None
