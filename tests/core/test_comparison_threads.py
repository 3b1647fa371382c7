"""The comparison kernel and threads: inputs too small to split (one part) are folded in the
calling thread, without launching the numba thread team, into exactly the state the parallel
kernel computes for one part; larger inputs compared from many Python threads at once (each
launching its own OpenMP team) give what they give alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numba
import numpy as np
import pytest

from debug_framework.comparison import _kernel as K
from debug_framework.comparison import compare
from debug_framework.comparison._state import KernelParams, new_state

PARAMS = KernelParams(ulp_mask=0x7FFFFFFF, rtol=1e-4, atol=1e-5, gross_factor=10.0,
                      rel_eps=float(np.finfo(np.float32).eps), equal_nan=False)


def _pair(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(n).astype(np.float32)
    a = (r + rng.standard_normal(n).astype(np.float32) * 1e-4).astype(np.float32)
    if n > 10:
        a[3], r[5], a[7], r[7], a[9] = np.nan, np.inf, -np.inf, -np.inf, r[9] + 1.0
    return a, r


def _fold(kernel, a, r, base, *extra):
    state = new_state(5)
    kernel(a, r, a.view(np.int32), r.view(np.int32), np.int64(base), *PARAMS, *state, *extra)
    return state


@pytest.mark.parametrize("n", [1, 2, 17, 4096, 2 * (1 << 16) - 1])
def test_serial_fold_equals_the_parallel_kernel(n):
    a, r = _pair(n, n)
    errs_s, errs_p = np.zeros(n), np.zeros(n)
    serial = _fold(K.accumulate_serial, a, r, 11, errs_s)
    with numba.parallel_chunksize(1):
        parallel = _fold(K.accumulate, a, r, 11, errs_p, K.num_threads())
    for s, p in zip((*serial, errs_s), (*parallel, errs_p), strict=True):
        np.testing.assert_array_equal(s, p)


def test_fold_takes_the_serial_path_below_two_parts_only(monkeypatch):
    calls = []
    real = K.accumulate_serial
    monkeypatch.setattr(K, "accumulate_serial", lambda *args: calls.append(args[0].shape[0]) or real(*args))
    for n in (100, 2 * (1 << 16) - 1, 2 * (1 << 16)):
        a, r = _pair(n, 0)
        K.fold(a, r, a.view(np.int32), r.view(np.int32), np.int64(0), PARAMS, new_state(5))
    assert calls == [100, 2 * (1 << 16) - 1]


def test_parallel_kernel_launched_from_eight_threads_at_once():
    pairs = []
    for i in range(8):
        n = 2 * (1 << 16) + 4099 * i  # the parallel path, different lengths
        r = np.random.default_rng(i).standard_normal(n).astype(np.float32)
        a = r.copy()
        a[::997] += 1e-3
        a[13 * i + 1] += 1.0 + i  # one gross error per pair, at its own index
        a[n - 1 - i] = np.nan
        pairs.append((r, a))
    alone = [compare(r, a).to_dict() for r, a in pairs]
    errors: list[BaseException] = []
    wrong: list[tuple] = []
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(10):
                d, e = compare(*pairs[i]).to_dict(), alone[i]
                for k in ("numel", "finite_count", "mismatch_count", "gross_mismatch_count", "max_abs_error",
                          "max_ulp_error", "nan_count_alt", "first_nonfinite_index"):
                    if d[k] != e[k]:
                        wrong.append((i, k, d[k], e[k]))
                if [w["index"] for w in d["worst"]] != [w["index"] for w in e["worst"]]:
                    wrong.append((i, "worst", d["worst"][:1], e["worst"][:1]))
                if d["mean_abs_error"] != pytest.approx(e["mean_abs_error"], rel=1e-12):  # float64 sums, any order
                    wrong.append((i, "mean_abs_error", d["mean_abs_error"], e["mean_abs_error"]))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []
    assert all([13 * i + 1] in [w["index"] for w in d["worst"]] for i, d in enumerate(alone))  # beside the NaN


def test_workqueue_threading_layer_launches_are_serialised(tmp_path):
    """numba's workqueue layer (no TBB, no OpenMP) aborts the process on concurrent launches:
    the kernel serialises them there, so threads comparing at once still work."""
    script = (
        "import threading, numpy as np, numba\n"
        "from debug_framework.comparison import compare\n"
        "r = np.random.default_rng(0).standard_normal(3 * (1 << 16)).astype(np.float32); a = r + 1e-3\n"
        "want = compare(r, a).mismatch_count\n"
        "out = []\n"
        "ts = [threading.Thread(target=lambda: out.extend(compare(r, a).mismatch_count for _ in range(5)))"
        " for _ in range(6)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "assert numba.threading_layer() == 'workqueue' and out == [want] * 30, out\n"
    )
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
