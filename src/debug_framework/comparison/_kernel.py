"""The fused single-pass comparison kernel (CPU, numba).

One call streams over a pair of flat arrays and folds every metric into a small state:
sums in float64, counts, the max ULP distance, a log-bucketed histogram of absolute errors (for
quantiles) and the k worst elements. Work is split across threads in contiguous ranges; each range
is walked in cache-sized blocks. Per block, one vectorised pass does all the arithmetic (maxima as
integer maxima of bit patterns, histogram keys stored as uint16), assuming every pair finite and
redone with checks when the block's sum says otherwise; the histogram scatter, the top-k update
(rarely needed) and the non-finite path then re-read the block from L1, not RAM.

Extra memory is O(threads x (histogram + k)), independent of the input size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic, overload

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
_NSUB = 4  # interleaved sub-histograms (uint32: 4 x 128 KiB stay in a 1 MiB L2 with room to spare)
_MAX_PART = 1 << 31  # elements per range pass, so that no uint32 histogram count can overflow

#: Whether the compiled kernels are cached on disk. numba needs a writable ``__pycache__`` beside
#: this file, ``NUMBA_CACHE_DIR`` or a writable ``~/.cache``; a read-only install run by an account
#: without a writable HOME has none, and there the kernels are compiled in memory at each start.
CACHE_ENABLED = True


def _cached_njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``njit(cache=True, **options)``, or ``njit(cache=False, ...)`` where numba finds nowhere to
    write its cache ("cannot cache function ...: no locator available")."""

    def decorate(fn: Callable[..., Any]) -> Any:
        global CACHE_ENABLED
        if CACHE_ENABLED:
            try:
                return njit(cache=True, **options)(fn)
            except RuntimeError as exc:
                if "no locator available" not in str(exc):
                    raise
                CACHE_ENABLED = False
        return njit(cache=False, **options)(fn)

    return decorate


@_cached_njit()
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


@intrinsic
def _bits(typingctx, x):
    """The int64 bit pattern of a float64: an LLVM bitcast, so loops using it still vectorise.
    For non-negative, non-NaN values the bit patterns order like the values, and an integer max
    reduction vectorises where a float one (NaN rules) does not."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _from_bits(typingctx, x):
    """The float64 whose bit pattern is the int64 ``x``."""
    if x != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


def _ulp_zero(ai):
    """Zero of the ULP accumulator's type for the integer views ``ai`` (or None: no ULP)."""


@overload(_ulp_zero)
def _ulp_zero_impl(ai):
    # ULP distances of formats up to 32 bits fit in uint32, so their loop runs in 32-bit lanes
    if isinstance(ai, types.Array) and ai.dtype.bitwidth <= 32:
        return lambda ai: np.uint32(0)
    return lambda ai: np.uint64(0)


def _ulp_dist(ia, ir, mask, fin):
    """ULP distance of two float bit patterns ``ia``/``ir`` (signed integer views; ``mask`` is the
    magnitude mask), 0 where ``fin`` is false. Same-sign values: the difference of the patterns;
    opposite signs: the sum of the magnitudes. Unsigned, so float64 distances up to 2**64 - 2 are exact."""


@overload(_ulp_dist)
def _ulp_dist_impl(ia, ir, mask, fin):
    # Branch-free (a select against a constant 0 stops LLVM's vectoriser; a mask does not).
    if ia.bitwidth <= 32:
        def impl32(ia, ir, mask, fin):
            x = np.int32(ia)
            y = np.int32(ir)
            m = np.int32(mask)
            # every step cast back to 32 bits: numba widens small-integer arithmetic to 64 bits
            d = np.int32(x - y)
            same = np.uint32(d if d >= 0 else np.int32(-d))
            opposite = np.uint32(np.uint32(x & m) + np.uint32(y & m))
            u = same if np.int32(x ^ y) >= 0 else opposite
            return np.uint32(u & np.uint32(np.uint32(0) - np.uint32(fin)))
        return impl32

    def impl64(ia, ir, mask, fin):
        x = np.int64(ia)
        y = np.int64(ir)
        d = x - y
        u = np.uint64(d if d >= 0 else -d) if (x ^ y) >= 0 else np.uint64(x & mask) + np.uint64(y & mask)
        return u & (np.uint64(0) - np.uint64(fin))
    return impl64


@intrinsic
def _fma(typingctx, x, y, z):
    """x * y + z, fused where the CPU can (LLVM's fmuladd, marked reassociable so that a sum of
    products still vectorises). Only the sums use it: the tolerance bound stays a separately
    rounded multiply and add, as in NumPy's allclose."""
    if not (x == y == z == types.float64):
        return None

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args, fastmath=("reassoc", "contract"))

    return types.float64(types.float64, types.float64, types.float64), codegen


@_cached_njit(fastmath={"reassoc"}, error_model="numpy")
def _block_pass(a, r, ai, ri, mask, u0, m, rtol, atol, gross_factor, rel_eps, keys, errs, careful):
    """The arithmetic of one block, branch-free so it vectorises: its sums, counts and maxima (as
    integer maxima of bit patterns), each element's histogram key into ``keys`` (and its error into
    ``errs``), and the max ULP distance. With ``careful`` (a constant once inlined) non-finite
    pairs are zeroed and keyed to the last bucket; without, every pair is taken to be finite."""
    s_ad = 0.0
    s_d2 = 0.0
    s_r2 = 0.0
    s_a2 = 0.0
    s_ar = 0.0
    s_rel = 0.0
    n_mis = 0
    n_gross = 0
    m_rel_bits = np.int64(0)
    m_ad_bits = np.int64(0)
    m_ulp = _ulp_zero(ai)
    for jj in range(m):
        j = np.uint64(jj)
        x = np.float64(a[u0 + j])
        y = np.float64(r[u0 + j])
        fin = ((x - x == 0.0) & (y - y == 0.0)) if careful else True
        x = x if fin else 0.0
        y = y if fin else 0.0
        d = x - y
        ad = abs(d)
        ay = abs(y)
        s_ad += ad
        s_d2 = _fma(d, d, s_d2)
        s_r2 = _fma(y, y, s_r2)
        s_a2 = _fma(x, x, s_a2)
        s_ar = _fma(x, y, s_ar)
        bound = atol + rtol * ay
        n_mis += np.int64(ad > bound)
        n_gross += np.int64(ad > gross_factor * bound)
        rel = ad / (ay if ay > rel_eps else rel_eps)
        s_rel += rel
        rb = _bits(rel)
        m_rel_bits = rb if rb > m_rel_bits else m_rel_bits
        adb = _bits(ad)
        m_ad_bits = adb if adb > m_ad_bits else m_ad_bits
        keys[j] = np.uint16(adb >> HIST_SHIFT) if fin else np.uint16(HIST_BUCKETS)
        if errs is not None:  # resolved at compile time: the exact-quantile path keeps every error
            errs[u0 + j] = ad if fin else np.inf
        if ai is not None:  # resolved at compile time: None means no ULP
            u = _ulp_dist(ai[u0 + j], ri[u0 + j], mask, fin)
            m_ulp = u if u > m_ulp else m_ulp
    # the sums in the state's order (F_SUM_AD .. F_SUM_REL)
    return (s_ad, s_d2, s_r2, s_a2, s_ar, s_rel), n_mis, n_gross, m_rel_bits, m_ad_bits, m_ulp


@_cached_njit(fastmath={"reassoc"}, error_model="numpy")
def _range_pass(a, r, ai, ri, mask, lo, hi, base, rtol, atol, gross_factor, rel_eps, equal_nan,
                fs, cnt, hist, ulp, tv, ti, nfi, errs):
    # Indices are unsigned throughout: numba then skips its negative-index wrap-around check,
    # which otherwise stops LLVM from vectorising the loops.
    keys = np.empty(_BLOCK, np.uint16)
    h = np.zeros((_NSUB, HIST_BUCKETS + 1), np.uint32)  # last bucket: non-finite (discarded)
    thr = tv[0]
    for j in range(1, tv.shape[0]):
        if tv[j] < thr:
            thr = tv[j]
    thr_bits = _bits(thr)
    m_rel_bits = _bits(fs[F_MAX_REL])
    m_ulp = _ulp_zero(ai)
    n_nonfinite = 0
    n_mis = 0
    n_gross = 0
    i0 = lo
    while i0 < hi:
        m = min(_BLOCK, hi - i0)
        u0 = np.uint64(i0)
        # One arithmetic pass over the block, optimistic: it assumes every pair is finite. A non-finite
        # pair (or an overflow) makes the block's sum of errors non-finite; the block is then done
        # again with the finiteness checks, which cost about a fifth of the pass.
        res = _block_pass(a, r, ai, ri, mask, u0, m, rtol, atol, gross_factor, rel_eps, keys, errs, False)
        if not res[0][F_SUM_AD] - res[0][F_SUM_AD] == 0.0:
            res = _block_pass(a, r, ai, ri, mask, u0, m, rtol, atol, gross_factor, rel_eps, keys, errs, True)
        sums, b_mis, b_gross, b_rel_bits, b_max_ad, b_ulp = res
        for k in range(F_SUM_REL + 1):
            fs[k] += sums[k]
        n_mis += b_mis
        n_gross += b_gross
        m_rel_bits = max(m_rel_bits, b_rel_bits)
        m_ulp = max(m_ulp, b_ulp)
        # histogram of the block's absolute errors: a tight scatter into interleaved
        # sub-histograms (repeated hits on one bucket would otherwise serialise on
        # store-to-load forwarding)
        jj = 0
        while jj + _NSUB <= m:
            j = np.uint64(jj)
            for s in range(_NSUB):
                h[s, keys[j + np.uint64(s)]] += np.uint32(1)
            jj += _NSUB
        while jj < m:
            h[0, keys[np.uint64(jj)]] += np.uint32(1)
            jj += 1
        # k worst finite elements (the first of them is the max absolute error), recomputed from
        # the block's inputs (still in cache) only when the block's max beats the current k-th
        # worst: after warm-up, hardly ever
        if b_max_ad > thr_bits or thr < 0.0:
            for jj in range(m):
                j = np.uint64(jj)
                x = np.float64(a[u0 + j])
                y = np.float64(r[u0 + j])
                if (x - x == 0.0) and (y - y == 0.0):
                    ad = abs(x - y)
                    if ad > thr:
                        thr = _topk_insert(tv, ti, ad, base + i0 + jj)
            thr_bits = _bits(thr)
        # rare path: non-finite pairs (their key is the histogram's last bucket)
        nf = np.int64(h[0, HIST_BUCKETS])
        for s in range(1, _NSUB):
            nf += np.int64(h[s, HIST_BUCKETS])
        if nf != n_nonfinite:
            n_nonfinite = nf
            for jj in range(m):
                j = np.uint64(jj)
                x = np.float64(a[u0 + j])
                y = np.float64(r[u0 + j])
                if (x - x == 0.0) and (y - y == 0.0):
                    continue
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
    fs[F_MAX_REL] = _from_bits(m_rel_bits)
    ulp[0] = max(ulp[0], np.uint64(m_ulp))
    for b in range(HIST_BUCKETS):
        c = np.int64(h[0, b])
        for s in range(1, _NSUB):
            c += np.int64(h[s, b])
        hist[b] += c
    cnt[I_FINITE] += (hi - lo) - n_nonfinite
    cnt[I_MISMATCH] += n_mis
    cnt[I_GROSS] += n_gross


@_cached_njit()
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


@_cached_njit(parallel=True, error_model="numpy")
def accumulate(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan,
               fs, cnt, hist, ulp, tv, ti, nfi, errs, nthreads):
    """Fold the pair (a, r) (flat, same length) into the state arrays.

    ``ai``/``ri`` are integer views of the values in the dtype whose ULPs are measured (``mask`` is
    that dtype's magnitude mask), or both None for no ULP. ``base`` is the flat index of ``a[0]``.
    ``errs`` is None, or a float64 array as long as ``a`` that receives each pair's absolute error
    (+inf where a side is not finite), for exact quantiles (:func:`exact_order_statistics`).
    """
    n = a.shape[0]
    # Work is cut into parts handed out dynamically (the caller sets chunk size 1), so one thread
    # stalled by another process does not hold the others up; partial state is per worker thread.
    parts = max(1, min(nthreads * _PARTS_PER_THREAD, n // _MIN_PER_THREAD), (n + _MAX_PART - 1) // _MAX_PART)
    pfs, pcnt, phist, pulp, ptv, pti, pnfi = _partials(nthreads, fs, tv, nfi)
    for p in prange(parts):
        t = numba.get_thread_id()
        lo = n * p // parts
        hi = n * (p + 1) // parts
        _range_pass(a, r, ai, ri, mask, lo, hi, base, rtol, atol, gross_factor, rel_eps, equal_nan,
                    pfs[t], pcnt[t], phist[t], pulp[t], ptv[t], pti[t], pnfi[t], errs)
    _merge(fs, cnt, hist, ulp, tv, ti, nfi, pfs, pcnt, phist, pulp, ptv, pti, pnfi)


@_cached_njit(error_model="numpy")
def accumulate_serial(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan,
                      fs, cnt, hist, ulp, tv, ti, nfi, errs):
    """:func:`accumulate` in the calling thread, for inputs too small to split (one part): the
    same pass over the same single range, so the same state, without a parallel launch."""
    if a.shape[0] > _MAX_PART:
        raise ValueError("accumulate_serial takes at most 2**31 elements; use accumulate")
    pfs, pcnt, phist, pulp, ptv, pti, pnfi = _partials(1, fs, tv, nfi)
    _range_pass(a, r, ai, ri, mask, 0, a.shape[0], base, rtol, atol, gross_factor, rel_eps, equal_nan,
                pfs[0], pcnt[0], phist[0], pulp[0], ptv[0], pti[0], pnfi[0], errs)
    _merge(fs, cnt, hist, ulp, tv, ti, nfi, pfs, pcnt, phist, pulp, ptv, pti, pnfi)


@_cached_njit(error_model="numpy")
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


def fold(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, state, errs=None) -> None:
    """Python entry: :func:`accumulate` with dynamic scheduling over all numba threads; an input
    too small to split (one part) is folded in the calling thread instead, since launching the
    thread team costs far more than the pass (tens of ms on a loaded machine, or with many
    Python threads comparing at once, against microseconds)."""
    if a.shape[0] < 2 * _MIN_PER_THREAD:  # accumulate would make a single part
        accumulate_serial(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, *state, errs)
        return
    global _serialize_launches
    if _serialize_launches is False:
        with numba.parallel_chunksize(1):
            accumulate(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, *state, errs, num_threads())
        return
    with _launch_lock:
        with numba.parallel_chunksize(1):
            accumulate(a, r, ai, ri, mask, base, rtol, atol, gross_factor, rel_eps, equal_nan, *state, errs, num_threads())
        if _serialize_launches is None:
            _serialize_launches = numba.threading_layer() not in _THREADSAFE_LAYERS


#: numba's threading layers that take parallel launches from several Python threads at once. The
#: ``workqueue`` layer (chosen when neither TBB nor OpenMP is there, e.g. macOS wheels without
#: libomp) aborts the whole process on a concurrent launch, so launches are then serialised; which
#: layer numba picked is known only after its first launch, which is therefore serialised too.
_THREADSAFE_LAYERS = ("tbb", "omp")
_launch_lock = threading.Lock()
_serialize_launches: bool | None = None


@_cached_njit()
def _gather_buckets(errs, targets, sizes):
    """The values of ``errs`` whose histogram bucket is ``targets[t]``, one array per target
    (``sizes[t]`` values each, as the histogram counted)."""
    out = [np.empty(sizes[t], np.float64) for t in range(targets.shape[0])]
    fill = np.zeros(targets.shape[0], np.int64)
    for i in range(errs.shape[0]):
        v = errs[i]
        if v == np.inf:  # a non-finite pair
            continue
        key = _bits(v) >> HIST_SHIFT
        for t in range(targets.shape[0]):
            if key == targets[t]:
                out[t][fill[t]] = v
                fill[t] += 1
                break
    return out


def exact_order_statistics(errs: np.ndarray, hist: np.ndarray, ranks: list[int]) -> list[float]:
    """The ``ranks``-th smallest finite errors (0-based) of ``errs`` (filled by the kernel; +inf
    marks a non-finite pair), exactly: the histogram names the bucket of each rank, and only that
    bucket's values are gathered and sorted. One pass over ``errs``, no sort of the whole array."""
    cum = np.cumsum(hist)
    buckets = [int(np.searchsorted(cum, r, side="right")) for r in ranks]
    targets = np.array(sorted(set(buckets)), np.int64)
    sizes = np.array([int(hist[b]) for b in targets], np.int64)
    gathered = dict(zip(targets.tolist(), (np.sort(g) for g in _gather_buckets(errs, targets, sizes)), strict=True))
    out = []
    for r, b in zip(ranks, buckets, strict=True):
        below = int(cum[b - 1]) if b > 0 else 0
        out.append(float(gathered[b][r - below]))
    return out
