"""The fused single-pass comparison kernel (CPU, numba).

One call streams over a pair of flat arrays and folds every metric into a small state:
sums in float64, counts, the max ULP distance, a log-bucketed histogram of absolute errors (for
quantiles) and the k worst elements. Work is split across threads in contiguous ranges; each range
is walked in cache-sized blocks. Per block, one vectorised pass does all the arithmetic (maxima as
integer maxima of bit patterns, histogram keys stored as uint16), assuming every pair finite and
redone with checks when the block's sum says otherwise; the histogram scatter, the top-k update
(rarely needed) and the non-finite path then re-read the block from L1, not RAM.

Extra memory is O(threads x (histogram + k)), independent of the input size. The state and the
comparison's constants are named records (``_state.KernelState``, ``_state.KernelParams``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic, overload

from ._state import HIST_BUCKETS, HIST_SHIFT, TOTALS, KernelParams, KernelState

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


class _BlockTotals(NamedTuple):
    """What :func:`_block_pass` returns for one block."""

    sum_abs_error: float
    sum_sq_error: float
    sum_sq_ref: float
    sum_sq_alt: float
    sum_alt_ref: float
    sum_rel_error: float
    mismatch_count: int
    gross_mismatch_count: int
    max_rel_bits: int  # bit pattern of the max relative error
    max_abs_bits: int  # bit pattern of the max absolute error
    max_ulp_error: Any  # uint32 or uint64 (see _ulp_zero)


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
    return _BlockTotals(s_ad, s_d2, s_r2, s_a2, s_ar, s_rel, n_mis, n_gross, m_rel_bits, m_ad_bits, m_ulp)


@_cached_njit(fastmath={"reassoc"}, error_model="numpy")
def _range_pass(a, r, ai, ri, lo, hi, base, params, state, errs):
    """Fold ``a[lo:hi]``/``r[lo:hi]`` (flat indices from ``base``) into ``state``, one thread's partial
    state (``totals`` of shape (1,)), under the comparison's ``params`` (a :class:`KernelParams`)."""
    # the comparison's constants by name, passed on to the block pass (the hot loop) as plain scalars
    mask = params.ulp_mask
    rtol = params.rtol
    atol = params.atol
    gross_factor = params.gross_factor
    rel_eps = params.rel_eps
    tot = state.totals[0]
    worst_errors = state.worst_errors
    worst_indices = state.worst_indices
    nonfinite_mismatch_indices = state.nonfinite_mismatch_indices
    # Indices are unsigned throughout: numba then skips its negative-index wrap-around check,
    # which otherwise stops LLVM from vectorising the loops.
    keys = np.empty(_BLOCK, np.uint16)
    h = np.zeros((_NSUB, HIST_BUCKETS + 1), np.uint32)  # last bucket: non-finite (discarded)
    thr = worst_errors[0]
    for j in range(1, worst_errors.shape[0]):
        if worst_errors[j] < thr:
            thr = worst_errors[j]
    thr_bits = _bits(thr)
    m_rel_bits = _bits(tot.max_rel_error)
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
        blk = _block_pass(a, r, ai, ri, mask, u0, m, rtol, atol, gross_factor, rel_eps, keys, errs, False)
        if not blk.sum_abs_error - blk.sum_abs_error == 0.0:
            blk = _block_pass(a, r, ai, ri, mask, u0, m, rtol, atol, gross_factor, rel_eps, keys, errs, True)
        tot.sum_abs_error += blk.sum_abs_error
        tot.sum_sq_error += blk.sum_sq_error
        tot.sum_sq_ref += blk.sum_sq_ref
        tot.sum_sq_alt += blk.sum_sq_alt
        tot.sum_alt_ref += blk.sum_alt_ref
        tot.sum_rel_error += blk.sum_rel_error
        n_mis += blk.mismatch_count
        n_gross += blk.gross_mismatch_count
        m_rel_bits = max(m_rel_bits, blk.max_rel_bits)
        m_ulp = max(m_ulp, blk.max_ulp_error)
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
        if blk.max_abs_bits > thr_bits or thr < 0.0:
            for jj in range(m):
                j = np.uint64(jj)
                x = np.float64(a[u0 + j])
                y = np.float64(r[u0 + j])
                if (x - x == 0.0) and (y - y == 0.0):
                    ad = abs(x - y)
                    if ad > thr:
                        thr = _topk_insert(worst_errors, worst_indices, ad, base + i0 + jj)
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
                    tot.nan_count_alt += 1
                elif x - x != 0.0:
                    if x > 0:
                        tot.posinf_count_alt += 1
                    else:
                        tot.neginf_count_alt += 1
                if yr:
                    tot.nan_count_ref += 1
                elif y - y != 0.0:
                    if y > 0:
                        tot.posinf_count_ref += 1
                    else:
                        tot.neginf_count_ref += 1
                flat = base + i0 + jj
                if tot.first_nonfinite_index < 0 or flat < tot.first_nonfinite_index:
                    tot.first_nonfinite_index = flat
                if xa and yr:
                    match = params.equal_nan
                elif (not xa) and (not yr) and x == y:
                    match = True
                else:
                    match = False
                if not match:
                    n_mis += 1
                    n_gross += 1
                    # keep the k smallest flat indices (parts may arrive in any order)
                    c = tot.nonfinite_mismatch_count
                    if c < nonfinite_mismatch_indices.shape[0]:
                        nonfinite_mismatch_indices[c] = flat
                    else:
                        pos = 0
                        for q in range(1, nonfinite_mismatch_indices.shape[0]):
                            if nonfinite_mismatch_indices[q] > nonfinite_mismatch_indices[pos]:
                                pos = q
                        if flat < nonfinite_mismatch_indices[pos]:
                            nonfinite_mismatch_indices[pos] = flat
                    tot.nonfinite_mismatch_count = c + 1
        i0 += m
    tot.max_rel_error = _from_bits(m_rel_bits)
    tot.max_ulp_error = max(tot.max_ulp_error, np.uint64(m_ulp))
    hist = state.hist
    for b in range(HIST_BUCKETS):
        c = np.int64(h[0, b])
        for s in range(1, _NSUB):
            c += np.int64(h[s, b])
        hist[b] += c
    tot.finite_count += (hi - lo) - n_nonfinite
    tot.mismatch_count += n_mis
    tot.gross_mismatch_count += n_gross


@_cached_njit()
def _partials(nt, state):
    """Empty partial states for ``nt`` workers (first axis of each field), as :func:`_range_pass`
    takes them (each worker's max relative error starts at the state's)."""
    k = state.worst_errors.shape[0]
    totals = np.zeros(nt, TOTALS)
    for t in range(nt):
        totals[t].first_nonfinite_index = -1
        totals[t].max_rel_error = state.totals[0].max_rel_error
    return KernelState(
        totals,
        np.zeros((nt, HIST_BUCKETS), np.int64),
        np.full((nt, k), -1.0),
        np.full((nt, k), -1, np.int64),
        np.full((nt, state.nonfinite_mismatch_indices.shape[0]), -1, np.int64),
    )


# The two entry points take the comparison's constants and the state as plain arguments, the fields
# of a KernelParams then of a KernelState in their order (numba types plain arguments in C, named
# tuples in Python: several microseconds a call), and name them again at once; only :func:`fold`
# calls them, unpacking both records in that one place.


@_cached_njit(parallel=True, error_model="numpy")
def accumulate(a, r, ai, ri, base, ulp_mask, rtol, atol, gross_factor, rel_eps, equal_nan,
               totals, hist, worst_errors, worst_indices, nonfinite_mismatch_indices, errs, nthreads):
    """Fold the pair (a, r) (flat, same length) into the state (a :class:`KernelState`'s fields)
    under the comparison's constants (a :class:`KernelParams`'s fields).

    ``ai``/``ri`` are integer views of the values in the dtype whose ULPs are measured (``ulp_mask``
    is that dtype's magnitude mask), or both None for no ULP. ``base`` is the flat index of ``a[0]``.
    ``errs`` is None, or a float64 array as long as ``a`` that receives each pair's absolute error
    (+inf where a side is not finite), for exact quantiles (:func:`exact_order_statistics`).
    """
    state = KernelState(totals, hist, worst_errors, worst_indices, nonfinite_mismatch_indices)
    n = a.shape[0]
    # Work is cut into parts handed out dynamically (the caller sets chunk size 1), so one thread
    # stalled by another process does not hold the others up; partial state is per worker thread.
    parts = max(1, min(nthreads * _PARTS_PER_THREAD, n // _MIN_PER_THREAD), (n + _MAX_PART - 1) // _MAX_PART)
    partials = _partials(nthreads, state)
    # numba's parallel loop reads plain variables only: no named tuple built outside it
    p_totals, p_hist, p_worst_errors, p_worst_indices, p_nonfinite = partials
    for p in prange(parts):
        t = numba.get_thread_id()
        lo = n * p // parts
        hi = n * (p + 1) // parts
        _range_pass(a, r, ai, ri, lo, hi, base, KernelParams(ulp_mask, rtol, atol, gross_factor, rel_eps, equal_nan),
                    KernelState(p_totals[t:t + 1], p_hist[t], p_worst_errors[t], p_worst_indices[t], p_nonfinite[t]),
                    errs)
    _merge(state, partials)


@_cached_njit(error_model="numpy")
def accumulate_serial(a, r, ai, ri, base, ulp_mask, rtol, atol, gross_factor, rel_eps, equal_nan,
                      totals, hist, worst_errors, worst_indices, nonfinite_mismatch_indices, errs):
    """:func:`accumulate` in the calling thread, for inputs too small to split (one part): the
    same pass over the same single range, so the same state, without a parallel launch."""
    if a.shape[0] > _MAX_PART:
        raise ValueError("accumulate_serial takes at most 2**31 elements; use accumulate")
    params = KernelParams(ulp_mask, rtol, atol, gross_factor, rel_eps, equal_nan)
    state = KernelState(totals, hist, worst_errors, worst_indices, nonfinite_mismatch_indices)
    partials = _partials(1, state)
    mine = KernelState(partials.totals[0:1], partials.hist[0], partials.worst_errors[0],
                       partials.worst_indices[0], partials.nonfinite_mismatch_indices[0])
    _range_pass(a, r, ai, ri, 0, a.shape[0], base, params, mine, errs)
    _merge(state, partials)


@_cached_njit(error_model="numpy")
def _merge(state, partials):
    """Fold the per-thread partial states (first axis of each field) into ``state``."""
    tot = state.totals[0]
    worst_errors = state.worst_errors
    nt = partials.totals.shape[0]
    k = worst_errors.shape[0]
    for t in range(nt):
        p = partials.totals[t]
        tot.sum_abs_error += p.sum_abs_error
        tot.sum_sq_error += p.sum_sq_error
        tot.sum_sq_ref += p.sum_sq_ref
        tot.sum_sq_alt += p.sum_sq_alt
        tot.sum_alt_ref += p.sum_alt_ref
        tot.sum_rel_error += p.sum_rel_error
        if p.max_ulp_error > tot.max_ulp_error:
            tot.max_ulp_error = p.max_ulp_error
        if p.max_rel_error > tot.max_rel_error:
            tot.max_rel_error = p.max_rel_error
        tot.finite_count += p.finite_count
        tot.mismatch_count += p.mismatch_count
        tot.gross_mismatch_count += p.gross_mismatch_count
        tot.nan_count_alt += p.nan_count_alt
        tot.nan_count_ref += p.nan_count_ref
        tot.posinf_count_alt += p.posinf_count_alt
        tot.neginf_count_alt += p.neginf_count_alt
        tot.posinf_count_ref += p.posinf_count_ref
        tot.neginf_count_ref += p.neginf_count_ref
        v = p.first_nonfinite_index
        if v >= 0 and (tot.first_nonfinite_index < 0 or v < tot.first_nonfinite_index):
            tot.first_nonfinite_index = v
        tot.nonfinite_mismatch_count += p.nonfinite_mismatch_count
        for b in range(HIST_BUCKETS):
            state.hist[b] += partials.hist[t, b]
        # merge top-k
        thr = worst_errors[0]
        for j in range(1, k):
            if worst_errors[j] < thr:
                thr = worst_errors[j]
        for j in range(k):
            if partials.worst_indices[t, j] >= 0 and partials.worst_errors[t, j] > thr:
                thr = _topk_insert(worst_errors, state.worst_indices, partials.worst_errors[t, j],
                                   partials.worst_indices[t, j])
    # first non-finite mismatches: the smallest flat indices over all threads and earlier calls
    nfi = state.nonfinite_mismatch_indices
    kk = nfi.shape[0]
    allv = np.empty(kk * (nt + 1), np.int64)
    na = 0
    for j in range(kk):
        if nfi[j] >= 0:
            allv[na] = nfi[j]
            na += 1
    for t in range(nt):
        for j in range(kk):
            if partials.nonfinite_mismatch_indices[t, j] >= 0:
                allv[na] = partials.nonfinite_mismatch_indices[t, j]
                na += 1
    srt = np.sort(allv[:na])
    for j in range(kk):
        nfi[j] = srt[j] if j < na else -1


def num_threads() -> int:
    return int(numba.get_num_threads())


def fold(a: np.ndarray, r: np.ndarray, ai: np.ndarray | None, ri: np.ndarray | None, base: np.int64,
         params: KernelParams, state: KernelState, errs: np.ndarray | None = None) -> None:
    """Python entry: :func:`accumulate` with dynamic scheduling over all numba threads; an input
    too small to split (one part) is folded in the calling thread instead, since launching the
    thread team costs far more than the pass (tens of ms on a loaded machine, or with many
    Python threads comparing at once, against microseconds)."""
    if a.shape[0] < 2 * _MIN_PER_THREAD:  # accumulate would make a single part
        accumulate_serial(a, r, ai, ri, base, *params, *state, errs)
        return
    global _serialize_launches
    if _serialize_launches is False:
        with numba.parallel_chunksize(1):
            accumulate(a, r, ai, ri, base, *params, *state, errs, num_threads())
        return
    with _launch_lock:
        with numba.parallel_chunksize(1):
            accumulate(a, r, ai, ri, base, *params, *state, errs, num_threads())
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
