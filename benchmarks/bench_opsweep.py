"""Op-by-op conformance of Inductor on the CPU, and what allclose would say of a correct backend.

1. ``inductor`` sweeps every OpInfo operator (or the first ``--limit``) in float32, all samples
   (OpInfo's and the fuzzed ones), each judged against float64 eager by the calibrated rule. It
   prints the time, operators per minute, the operators covered (judged: passed or failed) beside
   BackendBench's 271, and every operator where Inductor and eager differ beyond the calibrated
   bound (or Inductor raises, crashes, hangs), with its worst sample and its repro (``python
   repro.py``: torch alone), verified in a fresh process.
2. The correct ``aot_eager`` backend sweeps the same operators and samples (``--aot-dtypes``,
   float32 by default): the operators the calibrated rule flags (the target is 0), and the operators
   BackendBench's judge (``torch.testing.assert_close``, atol = rtol = 1e-2) would flag on the same
   samples, against float64 eager and against eager in the same dtype.

    python -m benchmarks.bench_opsweep [--limit N] [--every K] [--workers 2] [--database bench_opsweep.db]
                                       [--minutes M]

Both sweeps are stored in the database and resume: running the command again continues where an
interrupted run stopped. ``--minutes M`` stops the Inductor sweep taking new operators after M
minutes, prints what it has, and runs ``aot_eager`` over the operators Inductor reached; the same
command run again goes on from there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from debug_framework.conformance import OpResult, SweepResult, SweepSettings, run_sweep

#: Operators BackendBench's OpInfo suite checks (its README and launch notes).
BACKENDBENCH_OPS = 271


def _sweep(backend: str, dtypes: list[str], args: argparse.Namespace, ops: list[str] | None,
           minutes: float | None = None) -> SweepResult:
    settings = SweepSettings(backend=backend, dtypes=dtypes, ops=ops, workers=args.workers, timeout_s=args.timeout,
                             repro_dir=Path(args.repro_dir) / backend, max_samples=args.max_samples,
                             time_budget_s=None if minutes is None else 60 * minutes, resume=not args.fresh)
    done = [0]
    start = time.perf_counter()

    def progress(r: OpResult, n: int, total: int) -> None:
        done[0] += 1
        if done[0] % 10 == 0 or r.passed is False:
            print(f"  [{backend}] {n}/{total} {r.op}: {r.verdict} ({time.perf_counter() - start:.0f} s)", flush=True)

    return run_sweep(settings, database=args.database, progress=progress)


def _covered(result: SweepResult) -> int:
    return sum(1 for o in result.ops if o.passed is not None)


def _print_by_decomposition(name: str, result: SweepResult) -> None:
    """The operators that passed only against PyTorch's decomposition on some sample (they differ
    from eager's kernel there, as the decomposition itself does), with how many such samples."""
    shared = [o for o in result.ops if o.counts.get("by_decomposition")]
    print(f"  passed against PyTorch's decomposition where eager's kernel computes otherwise ({len(shared)} "
          f"operators; not failures: {name} computes what torch.compile's traced definition does):")
    for o in shared:
        print(f"  - {o.op}: {o.counts['by_decomposition']} of {o.counts.get('samples', 0)} samples")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N OpInfo operators")
    parser.add_argument("--every", type=int, default=1, help="only every K-th OpInfo operator (a spread subset)")
    parser.add_argument("--ops", nargs="*", default=None, help="operator keys or patterns instead")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per sample before a hang")
    parser.add_argument("--max-samples", type=int, default=None, help="cap samples per op and dtype (quick runs)")
    parser.add_argument("--aot-dtypes", nargs="*", default=["float32"])
    parser.add_argument("--database", default="bench_opsweep.db")
    parser.add_argument("--repro-dir", default="bench_opsweep_repros")
    parser.add_argument("--skip-aot-eager", action="store_true")
    parser.add_argument("--fresh", action="store_true",
                        help="judge the selected operators again, replacing their stored rows (after a judge change)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop the Inductor sweep taking new operators after M minutes (it resumes next time)")
    args = parser.parse_args(argv)

    ops = args.ops
    if (args.limit is not None or args.every > 1) and ops is None:
        from debug_framework.conformance.ops import all_ops

        ops = list(all_ops())[:: args.every][: args.limit]

    ind = _sweep("inductor", ["float32"], args, ops, args.minutes)
    judged = [o for o in ind.ops if o.passed is not None]
    swept_s = sum(o.seconds for o in ind.ops)
    print(f"\ninductor, CPU, float32: {len(ind.ops)} OpInfo operators in {ind.seconds:.0f} s this run "
          f"({ind.resumed} read back from the database; {swept_s:.0f} s of operator time over {args.workers} workers)")
    if swept_s:
        wall = (f"{60 * len(judged) / max(ind.seconds, 1e-9):.1f} (this run, wall), " if not ind.resumed
                else "")  # a resumed run's wall clock leaves out the operators read back
        print(f"  operators per minute: {wall}{60 * args.workers * len(ind.ops) / swept_s:.1f} "
              f"(from per-operator time, skipped operators included)")
    verdicts = ind.to_dict()["verdicts"]
    print(f"  covered (judged): {len(judged)} operators, beside BackendBench's {BACKENDBENCH_OPS}; verdicts {verdicts}")
    print(f"  samples judged: {sum(o.counts.get('samples', 0) for o in ind.ops)}")
    if ind.left:
        print(f"  not reached within --minutes {args.minutes:g}: {ind.left} operators (run the command again to "
              f"resume; {args.database}, sweep {ind.sweep_key})")
    print(f"\n  operators where Inductor and eager differ beyond the calibrated bound, or Inductor fails "
          f"({len(ind.failing)}):")
    for o in ind.failing:
        w = o.worst or {}
        res = w.get("result") or {}
        print(f"  - {o.op}: {o.verdict}, pass rate {100 * (o.pass_rate or 0):.0f} %; worst sample "
              f"{w.get('source')}/{w.get('label')} {w.get('dtype')}: {res.get('reason')}")
        if o.repro:
            print(f"      repro: python {o.repro} ({'verified' if o.repro_verified else 'not verified'})")
    _print_by_decomposition("Inductor", ind)

    if args.skip_aot_eager:
        return 0
    aot_ops = [o.op for o in ind.ops] if ind.left else ops  # the operators Inductor reached
    if ind.left and not aot_ops:
        return 0
    aot = _sweep("aot_eager", list(args.aot_dtypes), args, aot_ops)
    judged_aot = [o for o in aot.ops if o.passed is not None]
    bb_oracle = [o.op for o in judged_aot if o.counts.get("allclose_oracle_fail", 0)]
    bb_eager = [o.op for o in judged_aot if o.counts.get("allclose_eager_fail", 0)]
    print(f"\naot_eager (correct), {', '.join(args.aot_dtypes)}: {len(judged_aot)} operators judged in "
          f"{aot.seconds:.0f} s this run")
    print(f"  flagged by the calibrated rule: {len(aot.failing)} {[o.op for o in aot.failing]}")
    _print_by_decomposition("aot_eager", aot)
    print(f"  flagged by allclose at BackendBench's tolerances (atol = rtol = 1e-2) against float64 eager: "
          f"{len(bb_oracle)} {bb_oracle}")
    print(f"  flagged by allclose at BackendBench's tolerances against eager in the same dtype: "
          f"{len(bb_eager)} {bb_eager}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
