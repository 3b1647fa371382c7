"""The parallel comparison kernel against a direct float64 NumPy computation of its state, on inputs
large enough to be split over threads (one vectorised arithmetic pass per block, ULP distances in
32-bit lanes for formats up to 32 bits and 64-bit lanes for float64, and no ULP at all)."""

from __future__ import annotations

import inspect

import numba
import numpy as np
import pytest

from debug_framework.comparison import _kernel as K
from debug_framework.comparison._state import (HIST_BUCKETS, HIST_SHIFT, KernelParams, KernelState, new_state,
                                               read_totals)

N = 3 * (1 << 17) + 12345  # several parts per thread, and a ragged last block
RTOL, ATOL, GROSS = 1e-4, 1e-6, 10.0


def _inputs(dtype: type, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(N).astype(dtype)
    a = (r + rng.standard_normal(N).astype(dtype) * dtype(1e-4)).astype(dtype)
    a[:1000] = r[:1000]  # exact matches: error 0
    a[5000], r[6000], a[7000], r[7000], r[8000] = np.nan, np.inf, -np.inf, -np.inf, np.nan
    a[9000], r[9000] = dtype(3.0), dtype(-2.5)  # opposite signs
    a[N - 1] = r[N - 1] + dtype(50.0)  # the worst element sits in the last, short block
    return a, r


def _ulp_reference(a: np.ndarray, r: np.ndarray, fin: np.ndarray) -> int:
    bits = {np.float32: np.int32, np.float64: np.int64}[a.dtype.type]
    mask = (1 << (a.dtype.itemsize * 8 - 1)) - 1
    ia = [int(v) for v in a[fin].view(bits)]
    ir = [int(v) for v in r[fin].view(bits)]
    return max(abs(x - y) if (x < 0) == (y < 0) else (x & mask) + (y & mask) for x, y in zip(ia, ir, strict=True))


@pytest.mark.parametrize(("dtype", "with_ulp"), [(np.float32, True), (np.float64, True), (np.float32, False)])
def test_parallel_kernel_state_matches_numpy(dtype, with_ulp):
    a, r = _inputs(dtype, 7)
    state = new_state(5)
    if with_ulp:
        ibits = np.int32 if dtype is np.float32 else np.int64
        ai, ri, mask = a.view(ibits), r.view(ibits), (1 << (a.dtype.itemsize * 8 - 1)) - 1
    else:
        ai, ri, mask = None, None, 0
    eps = float(np.finfo(dtype).eps)
    errs = np.full(N, -1.0) if with_ulp else None  # the exact-quantile buffer (or none)
    with numba.parallel_chunksize(1):
        params = KernelParams(ulp_mask=mask, rtol=RTOL, atol=ATOL, gross_factor=GROSS, rel_eps=eps, equal_nan=False)
        K.accumulate(a, r, ai, ri, np.int64(100), *params, *state, errs, K.num_threads())
    tot = read_totals(state)
    hist, tv, ti, nfi = state.hist, state.worst_errors, state.worst_indices, state.nonfinite_mismatch_indices

    x, y = a.astype(np.float64), r.astype(np.float64)
    fin = np.isfinite(x) & np.isfinite(y)
    xf, yf = x[fin], y[fin]
    ad = np.abs(xf - yf)
    bound = ATOL + RTOL * np.abs(yf)
    rel = ad / np.maximum(np.abs(yf), eps)
    nonfinite = np.flatnonzero(~fin)
    bad = [i for i in nonfinite if not (x[i] == y[i])]  # equal_nan=False: NaN never matches

    assert tot.finite_count == fin.sum()
    assert tot.mismatch_count == (ad > bound).sum() + len(bad)
    assert tot.gross_mismatch_count == (ad > GROSS * bound).sum() + len(bad)
    assert tot.nan_count_alt == 1 and tot.nan_count_ref == 1
    assert tot.posinf_count_ref == 1 and tot.neginf_count_alt == 1 and tot.neginf_count_ref == 1
    assert tot.posinf_count_alt == 0
    assert tot.first_nonfinite_index == 100 + nonfinite[0]
    assert tot.nonfinite_mismatch_count == len(bad)
    assert sorted(nfi[nfi >= 0]) == [100 + i for i in bad][: nfi.shape[0]]
    np.testing.assert_allclose(
        [tot.sum_abs_error, tot.sum_sq_error, tot.sum_sq_ref, tot.sum_sq_alt, tot.sum_alt_ref, tot.sum_rel_error],
        [ad.sum(), (ad * ad).sum(), (yf * yf).sum(), (xf * xf).sum(), (xf * yf).sum(), rel.sum()],
        rtol=1e-10,
    )
    assert tot.max_rel_error == rel.max()  # the same IEEE division, so bit-identical
    keys = ad.view(np.int64) >> HIST_SHIFT
    np.testing.assert_array_equal(hist, np.bincount(keys, minlength=HIST_BUCKETS))
    order = np.argsort(-ad, kind="stable")[:5]
    flat = np.flatnonzero(fin)[order] + 100
    assert sorted(zip(-tv, ti, strict=True)) == sorted(zip(-ad[order], flat, strict=True))
    assert ti[np.argmax(tv)] == 100 + N - 1
    assert tot.max_ulp_error == (_ulp_reference(a, r, fin) if with_ulp else 0)
    if errs is not None:  # every pair's error, +inf where a side is not finite
        np.testing.assert_array_equal(errs[fin], ad)
        assert np.isposinf(errs[~fin]).all()
        ranks = [0, 1, len(ad) // 2, len(ad) - 2, len(ad) - 1]
        assert K.exact_order_statistics(errs, hist, ranks) == np.sort(ad)[ranks].tolist()


@pytest.mark.parametrize("spread", ["ulp", "constant"])
def test_exact_quantiles_at_the_limit_equal_numpy(spread):
    """Up to 2**20 elements the quantiles are NumPy's, selected through the histogram (a third of
    the errors exactly 0, the rest a few ULPs; or every error the same value: one bucket holds all)."""
    from debug_framework.comparison import compare
    from debug_framework.comparison.engine import EXACT_QUANTILE_LIMIT

    rng = np.random.default_rng(5)
    n = EXACT_QUANTILE_LIMIT
    r = rng.standard_normal(n).astype(np.float32)
    if spread == "ulp":
        a = (r + rng.standard_normal(n).astype(np.float32) * np.float32(1e-7) * r).astype(np.float32)
    else:
        r = np.round(r * 4) / 4  # on a coarse grid, so that every difference is exactly 0.25
        a = (r + np.float32(0.25)).astype(np.float32)
    a[17], r[99] = np.nan, np.inf
    res = compare(r, a)
    fin = np.isfinite(a) & np.isfinite(r)
    ad = np.abs(a[fin].astype(np.float64) - r[fin].astype(np.float64))
    assert res.quantiles_exact
    assert res.median_abs_error == float(np.quantile(ad, 0.5))
    assert res.p99_abs_error == float(np.quantile(ad, 0.99))


@pytest.mark.parametrize("entry", ["accumulate", "accumulate_serial"])
def test_entry_points_take_the_records_fields_in_order(entry):
    """The kernels' entry points take a KernelParams's then a KernelState's fields, by the same names
    and in the same order (``fold`` passes ``*params, *state``): a renamed or reordered field fails here."""
    names = list(inspect.signature(getattr(K, entry).py_func).parameters)
    fields = [*KernelParams._fields, *KernelState._fields]
    start = names.index("base") + 1
    assert names[start:start + len(fields)] == fields
    assert names[start + len(fields)] == "errs"
