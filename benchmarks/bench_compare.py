"""Comparison core throughput and memory on two 64M-element float32 arrays.

Prints, measured in the same run: our ``compare`` (every metric, one pass), torch.testing.assert_close,
numpy.allclose and a plain read of both arrays (np.sum of each: the memory-bandwidth limit), as GB/s
of input read, with ratios; and the peak extra resident memory of each (Linux: VmHWM after a reset
through /proc/self/clear_refs, minus the resident size before the call).

    python -m benchmarks.bench_compare [--elements N] [--repeats R]

Targets (2-core machine): >= 20x assert_close, >= 0.5x the plain read, <= 64 MiB extra memory.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np
import torch

from debug_framework.comparison import compare
from debug_framework.measure import PeakMemory, Timer


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, float | None]:
    """(best seconds, peak extra MiB over the resident size before the call)."""
    fn()  # warm-up (JIT compile, page faults)
    times, extra = [], []
    for _ in range(repeats):
        with PeakMemory() as mem, Timer() as t:
            fn()
        times.append(t.seconds)
        if mem.result.delta_bytes is not None:
            extra.append(max(0, mem.result.delta_bytes) / 2**20)
    return min(times), (max(extra) if extra else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = args.elements
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(n, dtype=np.float32)
    # The main pair differs by about one float32 ULP (a third of the errors are exactly 0): the
    # error histogram's worst case, most errors landing in a few buckets. The second pair's errors
    # (about 1e-3, absolute) spread over more buckets.
    alt = ref + (rng.standard_normal(n, dtype=np.float32) * np.float32(1e-7)) * ref
    wide = ref + rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    tr, ta, tw = torch.from_numpy(ref), torch.from_numpy(alt), torch.from_numpy(wide)
    gb = 2 * n * 4 / 1e9

    rows = []
    rows.append(("plain read (np.sum x2)", *measure(lambda: (np.sum(ref), np.sum(alt)), args.repeats)))
    rows.append(("compare (ours, all metrics)", *measure(lambda: compare(tr, ta, rtol=1e-5, atol=1e-6), args.repeats)))
    rows.append(("  same, errors ~1e-3 (2nd pair)", *measure(lambda: compare(tr, tw, rtol=1e-5, atol=1e-6), args.repeats)))
    rows.append(("numpy.allclose", *measure(lambda: np.allclose(alt, ref, rtol=1e-5, atol=1e-6), max(1, args.repeats // 2))))
    rows.append(("torch.allclose", *measure(lambda: torch.allclose(ta, tr, rtol=1e-5, atol=1e-6), max(1, args.repeats // 2))))
    rows.append(("torch.testing.assert_close", *measure(lambda: torch.testing.assert_close(ta, tr, rtol=1e-5, atol=1e-6), max(1, args.repeats // 2))))

    res = compare(tr, ta, rtol=1e-5, atol=1e-6)
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, numba threads {__import__('numba').get_num_threads()}")
    print(f"inputs: 2 x {n:,} float32 ({gb:.2f} GB read per comparison); verdict {res.passed}, max_ulp {res.max_ulp_error}")
    by = {name: t for name, t, _ in rows}
    print(f"{'method':32} {'time s':>9} {'GB/s':>8} {'vs plain read':>14} {'ours vs it':>11} {'peak extra MiB':>15}")
    for name, t, mem in rows:
        ours_vs = by["compare (ours, all metrics)"]
        print(f"{name:32} {t:9.4f} {gb / t:8.2f} {by['plain read (np.sum x2)'] / t:13.2f}x {t / ours_vs:10.1f}x "
              f"{'' if mem is None else f'{mem:15.1f}'}")
    ours = by["compare (ours, all metrics)"]
    print()
    print(f"ours / assert_close speed: {by['torch.testing.assert_close'] / ours:.1f}x   (target >= 20x)")
    print(f"ours / plain read:         {by['plain read (np.sum x2)'] / ours:.2f}     (target >= 0.5)")
    mem = next(m for name, _, m in rows if name.startswith("compare"))
    print(f"ours peak extra memory:    {mem if mem is None else f'{mem:.1f}'} MiB (target <= 64 MiB)")
    print(f"  (what the kernel allocates per call, whatever the size: {_kernel_state_mib():.1f} MiB; the resident size "
          "grows by less when it reuses memory the warm-up call freed)")


def _kernel_state_mib() -> float:
    """Bytes the comparison kernel allocates for one call on all its threads (histograms, block
    keys, per-thread partial states), from its layout constants."""
    import numba

    from debug_framework.comparison import _kernel as K
    from debug_framework.comparison._state import HIST_BUCKETS, TOTALS

    threads = numba.get_num_threads()
    per_pass = K._NSUB * (HIST_BUCKETS + 1) * 4 + K._BLOCK * 2  # one range pass at a time per thread
    partial = HIST_BUCKETS * 8 + TOTALS.itemsize + 3 * 8 * 8  # per thread (k = 8)
    return (threads * (per_pass + partial) + HIST_BUCKETS * 8) / 2**20


if __name__ == "__main__":
    main()
