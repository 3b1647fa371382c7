"""Inputs too small to split (one part) are folded in the calling thread, without launching the
numba thread team: the state must be exactly what the parallel kernel computes for one part."""

from __future__ import annotations

import time

import numba
import numpy as np
import pytest

from debug_framework.comparison import _kernel as K
from debug_framework.comparison import compare


def _pair(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(n).astype(np.float32)
    a = (r + rng.standard_normal(n).astype(np.float32) * 1e-4).astype(np.float32)
    if n > 10:
        a[3], r[5], a[7], r[7], a[9] = np.nan, np.inf, -np.inf, -np.inf, r[9] + 1.0
    return a, r


def _fold(kernel, a, r, base, *extra):
    state = K.new_state(5)
    kernel(a, r, a.view(np.int32), r.view(np.int32), np.int64(0x7FFFFFFF), np.int64(base), 1e-4, 1e-5, 10.0,
           float(np.finfo(np.float32).eps), False, *state, *extra)
    return state


@pytest.mark.parametrize("n", [1, 2, 17, 4096, 2 * (1 << 16) - 1])
def test_serial_fold_equals_the_parallel_kernel(n):
    a, r = _pair(n, n)
    serial = _fold(K.accumulate_serial, a, r, 11)
    with numba.parallel_chunksize(1):
        parallel = _fold(K.accumulate, a, r, 11, K.num_threads())
    for s, p in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(s, p)


def test_fold_takes_the_serial_path_below_two_parts_only(monkeypatch):
    calls = []
    real = K.accumulate_serial
    monkeypatch.setattr(K, "accumulate_serial", lambda *args: calls.append(args[0].shape[0]) or real(*args))
    for n in (100, 2 * (1 << 16) - 1, 2 * (1 << 16)):
        a, r = _pair(n, 0)
        K.fold(a, r, a.view(np.int32), r.view(np.int32), np.int64(0x7FFFFFFF), np.int64(0), 1e-4, 1e-5, 10.0,
               1e-7, False, K.new_state(5))
    assert calls == [100, 2 * (1 << 16) - 1]


def test_small_comparisons_cost_no_thread_team_launch():
    a, r = _pair(256, 1)
    compare(a, r)
    t0 = time.perf_counter()
    for _ in range(50):
        compare(a, r)
    per_call = (time.perf_counter() - t0) / 50
    assert per_call < 0.005, f"{per_call * 1e3:.1f} ms per 256-element comparison"
