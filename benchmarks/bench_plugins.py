"""Kernel plugins: cold vs cached compile, op-sweep throughput, and coverage beside the anchors.

Measured on the shipped C++ example (``examples/plugins/cpp``: gelu, rms_norm) and, when Triton is
installed, the Triton softmax (interpreted on CPU without a GPU):

* compile: a cold build into an empty cache vs the same build served by the content-addressed cache;
* sweep: samples per second of the op-by-op sweep (worker process start included), per plugin;
* coverage: ops and samples per op, printed beside BackendBench's published OpInfo coverage (271 ops,
  about 13 tests per op, an op passing only when all its tests pass) and KernelBench's 5 random
  trials per kernel.

Measures and prints; asserts nothing.

    .venv/bin/python benchmarks/bench_plugins.py [--plugins cpp triton] [--skip-triton]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "plugins"

#: Published anchors (BackendBench's OpInfo suite; KernelBench's correctness check).
BACKENDBENCH_OPS, BACKENDBENCH_TESTS_PER_OP, KERNELBENCH_TRIALS = 271, 13, 5


def bench(name: str, cache: Path) -> dict[str, float | int | str]:
    from debug_framework.plugins.manifest import load_manifest
    from debug_framework.plugins.sweep import sweep_plugin
    from debug_framework.services.compilation_engine import CompilationEngine

    defn = load_manifest(EXAMPLES / name)
    engine = CompilationEngine(cache / name)
    t0 = time.perf_counter()
    cold = engine.build(defn)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = engine.build(defn)
    warm_s = time.perf_counter() - t0
    assert warm.cached  # the second build must come from the cache, or the figure means nothing
    report = sweep_plugin(defn, cold.artifact)
    samples = report.total_samples
    return {"plugin": defn.id, "cold_s": cold_s, "cached_s": warm_s, "ops": len(report.kernels),
            "samples": samples, "samples_per_op": samples / max(1, len(report.kernels)),
            "sweep_s": report.seconds, "samples_per_s": samples / report.seconds if report.seconds else 0.0,
            "passed": "yes" if report.passed else "no"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", nargs="+", default=["cpp", "triton"], choices=["cpp", "cpp_buggy", "triton"])
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-plugins-") as tmp:
        for name in args.plugins:
            try:
                rows.append(bench(name, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - a missing toolchain is reported, not fatal
                print(f"{name}: skipped ({exc})")
    print(f"{'plugin':18} {'cold compile':>13} {'cached':>9} {'ops':>4} {'samples':>8} {'per op':>7} "
          f"{'sweep s':>8} {'samples/s':>10} {'passed':>7}")
    for r in rows:
        print(f"{r['plugin']:18} {r['cold_s']:12.2f}s {r['cached_s']:8.4f}s {r['ops']:>4} {r['samples']:>8} "
              f"{r['samples_per_op']:7.1f} {r['sweep_s']:8.1f} {r['samples_per_s']:10.1f} {r['passed']:>7}")
    ops = sum(int(r["ops"]) for r in rows)
    per_op = sum(int(r["samples"]) for r in rows) / max(1, ops)
    print(f"\ncoverage, ours: {ops} ops of the shipped plugins, {per_op:.1f} samples per op "
          "(OpInfo + shape/stride/dtype/special-value fuzzing; an op passes only when all its samples pass)")
    print(f"anchor, BackendBench: {BACKENDBENCH_OPS} ops, ~{BACKENDBENCH_TESTS_PER_OP} OpInfo tests per op "
          "(same all-pass rule)")
    print(f"anchor, KernelBench: {KERNELBENCH_TRIALS} random-input trials per kernel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
