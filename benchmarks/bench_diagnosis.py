"""Diagnosis quality of the validation engine's default judgement beside plain allclose, in one run.

Every injected bug of :mod:`benchmarks.injected_bugs` (one layer each, on tiny Llama, Qwen2 and
BERT models with small activations, float32 and bfloat16 alternatives) and every correct pair is
validated twice per seed: with the engine's defaults (calibrated bounds, isolation), and with plain
allclose at torch.testing's defaults for the alternative's dtype (no calibration, no isolation):

* detection: the bug's session fails;
* localization: the first divergence is the buggy layer's checkpoint (and, for the defaults, the
  introducing layers are exactly that layer, the error source names it, and of its blocks, each
  judged on the reference's input to it, only the buggy one introduces error);
* false alarms: a correct pair's session fails (python_reference vs eager PyTorch in float32,
  bfloat16 and float16 on every family; eager PyTorch vs Inductor, ONNX Runtime and MLX in float32).

    python -m benchmarks.bench_diagnosis [--seeds 5] [--quick] [--no-compiled] [--family llama ...]

Target: 100 % detected and localized, 0 false alarms for the defaults.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.injected_bugs import BUG_LAYER, cases, expected_first, register_bug_backend  # noqa: E402
from benchmarks.models.tiny_transformers import FAMILIES, make_model  # noqa: E402

#: torch.testing.assert_close's defaults by dtype (the anchor: plain allclose, whole model)
TORCH_TESTING = {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}
JUDGES = ("defaults (calibrated)", "allclose @ torch.testing")


@dataclass
class Case:
    """One validation to run: a bug (None: a correct pair) on a family, dtype and seed."""

    bug: str | None
    family: str
    dtype: str
    seed: int
    reference: str = "python_reference"
    alternative: str | None = None  # None: the bug's backend (hf_correct for None)


def _cases(seeds: int, compiled: bool, families: tuple[str, ...] = FAMILIES) -> Iterator[Case]:
    for seed in range(seeds):
        for bug, family, dtype in cases():
            if family in families:
                yield Case(bug, family, dtype, seed)
        for family in families:
            for dtype in ("float32", "bfloat16", "float16"):
                yield Case(None, family, dtype, seed, alternative="pytorch")
        if compiled:
            for alt in ("inductor", "onnxruntime", "mlx"):
                yield Case(None, "llama", "float32", seed, reference="pytorch", alternative=alt)


def _config(judge: str, case: Case) -> dict[str, Any]:
    if judge == JUDGES[0]:
        return {"dtype": case.dtype, "seed": case.seed}
    rtol, atol = TORCH_TESTING[case.dtype]
    return {"dtype": case.dtype, "seed": case.seed, "calibrate": False, "isolate": False,
            "precision_thresholds": {"rtol": rtol, "atol": atol}}


def _available(names: list[str]) -> set[str]:
    from debug_framework.backends import backend_availability

    avail = backend_availability()
    return {n for n in names if avail.get(n, (False, ""))[0]}


def _judge_one(engine: Any, model: Path, case: Case, judge: str) -> dict[str, Any]:
    """Run one session; what it detected and where."""
    backend = case.alternative or register_bug_backend(case.bug)
    result = engine.run(engine.create_session(model, _config(judge, case), case.reference, backend))
    out: dict[str, Any] = {"failed": not result.passed}
    margins = [o.margin for o in result.results if o.margin is not None]
    out["margin"] = max(margins, default=float("nan"))  # the worst checkpoint's error / bound
    if case.bug is not None and result.first_divergence is not None:
        replay = result.first_divergence.introduced
        if replay is not None and replay.judgement.margin is not None:  # a block beyond its bound counts too
            out["margin"] = max(result.first_divergence.margin or 0.0, replay.judgement.margin)
    if case.bug is not None:
        first = result.first_divergence
        localized = first is not None and first.key == expected_first(case.bug)
        if judge == JUDGES[0]:  # the defaults also name the buggy block alone (judged on the reference's input)
            source = result.error_source or {}
            block = "attention" if expected_first(case.bug).name == "post_attention" else "mlp"
            blocks = result.isolation[BUG_LAYER].verdict.blocks if result.isolation else []
            localized = (localized and result.introducing_layers == [BUG_LAYER] and source.get("layer") == BUG_LAYER
                         and blocks == [block])
        out["localized"] = localized
    return out


@dataclass
class Tally:
    """Outcomes per judge (``detected``, ``localized``, ``false_alarm``), per (judge, dtype, kind), and the time."""

    overall: dict[str, dict[str, list[bool]]]
    per_dtype: dict[tuple[str, str, str], list[bool]]
    seconds: float
    #: the defaults' margins (error / bound): the largest over correct pairs, the smallest over the bugs
    worst_correct: tuple[float, str] = (0.0, "")
    weakest_bug: tuple[float, str] = (float("inf"), "")


def run(seeds: int, compiled: bool, families: tuple[str, ...] = FAMILIES) -> Tally:
    """Every case under both judges."""
    from debug_framework.services.validation_engine import ValidationEngine

    tmp = Path(tempfile.mkdtemp(prefix="bench-diagnosis-"))
    engine = ValidationEngine(tmp / "bench.db")
    models: dict[tuple[str, int], Path] = {}
    stats: dict[str, dict[str, list[bool]]] = {j: defaultdict(list) for j in JUDGES}
    per_dtype: dict[tuple[str, str, str], list[bool]] = defaultdict(list)
    extra = _available(["inductor", "onnxruntime", "mlx"]) if compiled else set()
    tally = Tally(stats, per_dtype, 0.0)
    start = time.perf_counter()
    for case in _cases(seeds, compiled, families):
        if case.reference == "pytorch" and case.alternative not in extra:
            continue
        key = (case.family, case.seed)
        if key not in models:
            models[key] = make_model(case.family, tmp / f"{case.family}{case.seed}", case.seed)
        for judge in JUDGES:
            got = _judge_one(engine, models[key], case, judge)
            if judge == JUDGES[0]:
                _track_margin(tally, case, got["margin"])
            if case.bug is None:
                stats[judge]["false_alarm"].append(got["failed"])
                per_dtype[(judge, case.dtype, "false_alarm")].append(got["failed"])
            else:
                stats[judge]["detected"].append(got["failed"])
                stats[judge]["localized"].append(got["localized"])
                per_dtype[(judge, case.dtype, "localized")].append(got["localized"])
    tally.seconds = time.perf_counter() - start
    return tally


def _track_margin(tally: Tally, case: Case, margin: float) -> None:
    what = f"{case.bug or case.alternative or 'correct'} {case.family} {case.dtype} seed {case.seed}"
    if case.bug is None and margin > tally.worst_correct[0]:
        tally.worst_correct = (margin, what)
    if case.bug is not None and margin < tally.weakest_bug[0]:
        tally.weakest_bug = (margin, what)


def _pct(values: list[bool]) -> str:
    return f"{100.0 * sum(values) / len(values):6.1f} % ({sum(values)}/{len(values)})" if values else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="models and inputs per case (default 5)")
    ap.add_argument("--quick", action="store_true", help="one seed, no compiled backends (a smoke run)")
    ap.add_argument("--no-compiled", action="store_true", help="skip the Inductor / ONNX Runtime / MLX pairs")
    ap.add_argument("--family", action="append", choices=FAMILIES, help="model families (repeatable; default all)")
    args = ap.parse_args(argv)
    seeds, compiled = (1, False) if args.quick else (args.seeds, not args.no_compiled)
    if seeds < 1:
        ap.error("--seeds must be at least 1")
    tally = run(seeds, compiled, tuple(args.family or FAMILIES))
    stats = tally.overall
    print(f"diagnosis over {seeds} seed(s): {len(stats[JUDGES[0]]['detected'])} bug sessions, "
          f"{len(stats[JUDGES[0]]['false_alarm'])} correct-pair sessions per judge ({tally.seconds:.0f} s)")
    print(f"{'judge':<28}{'detected':>22}{'localized':>22}{'false alarms':>22}")
    for judge in JUDGES:
        s = stats[judge]
        print(f"{judge:<28}{_pct(s['detected']):>22}{_pct(s['localized']):>22}{_pct(s['false_alarm']):>22}")
    print(f"defaults' margins (error / bound, at most 1 passes): worst correct pair {tally.worst_correct[0]:.3g} "
          f"({tally.worst_correct[1]}), weakest bug {tally.weakest_bug[0]:.3g} ({tally.weakest_bug[1]})")
    print("\nby alternative dtype (localized / false alarms):")
    per = tally.per_dtype
    for judge in JUDGES:
        for dtype in ("float32", "bfloat16", "float16"):
            loc, fa = per.get((judge, dtype, "localized"), []), per.get((judge, dtype, "false_alarm"), [])
            print(f"  {judge:<26}{dtype:<10}{_pct(loc):>22}{_pct(fa):>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
