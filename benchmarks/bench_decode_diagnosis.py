"""Diagnosis at decode steps: correct pairs that must pass every step, and decode-only bugs that
must be found at their step and layer with the prefill passing.

Each session prefills a batch of two rows and decodes ``--steps`` tokens (teacher-forced with the
reference's greedy tokens) through each backend's own KV cache:

* false alarms: a correct pair's session fails. The pairs: ``python_reference`` (float64) vs eager
  PyTorch in float32 and bfloat16 on tiny Llama and Mistral (a sliding window shorter than the
  prompt and the steps), right- and left-padded from an offset; vs the example paged engine
  (``examples/paged_kv_engine.py``, float32, left-padded); and eager PyTorch vs Inductor in float32
  (``--no-compiled`` skips it);
* detected: a bug's session fails; localized: its first divergence is the expected checkpoint at the
  expected step, every prefill checkpoint passes, and ``error_source`` is the expected kind
  (``decode``, or ``kv_cache`` for a cache stored at reduced precision) at the buggy layer;
  confirmed: the source is ``confirmed`` (a ``kv_cache`` source, or the layer replayed at the step
  beyond its bound: bug sessions run with ``isolate: "auto"``; an engine cannot replay a layer).

The bugs (:mod:`benchmarks.decode_bugs`): RoPE at the wrong position while decoding, a KV-cache write
off by one, the K/V cache stored in bfloat16, sliding-window eviction off by one, positions wrong
under left padding.

    python -m benchmarks.bench_decode_diagnosis [--seeds 5] [--steps 8] [--no-compiled] [--match inductor]

Target: 100 % detected and localized, 0 false alarms.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.decode_bugs import DECODE_BUGS, register_decode_bug  # noqa: E402
from benchmarks.models.tiny_transformers import make_model  # noqa: E402

_RIGHT = {"pad_lengths": [0, 2]}
_LEFT = {"padding_side": "left", "pad_lengths": [0, 3], "position_offset": 2}


@dataclass
class Case:
    """One decode session: a bug (None: a correct pair) on a family and seed."""

    name: str
    family: str
    seed: int
    reference: str = "python_reference"
    alternative: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    bug: str | None = None


def _correct(seed: int, compiled: bool) -> Iterator[Case]:
    for family in ("llama", "mistral"):
        for dtype in ("float32", "bfloat16"):
            for pad, extra in (("right", _RIGHT), ("left", _LEFT)):
                yield Case(f"python_reference vs pytorch {dtype} ({pad})", family, seed, alternative="pytorch",
                           config={"dtype": dtype, **extra})
        yield Case("python_reference vs paged engine float32 (left)", family, seed, alternative="paged_engine",
                   config=dict(_LEFT))
    if compiled:
        yield Case("pytorch vs inductor float32 (left)", "llama", seed, reference="pytorch", alternative="inductor",
                   config=dict(_LEFT))


def _cases(seeds: int, compiled: bool) -> Iterator[Case]:
    for seed in range(seeds):
        yield from _correct(seed, compiled)
        for bug, spec in DECODE_BUGS.items():
            yield Case(bug, spec.family, seed, config=dict(spec.config), bug=bug)


def _register_engine() -> str:
    from debug_framework.backends import register_backend, user_backend

    from benchmarks.decode_bugs import PagedLlamaEngine

    register_backend("paged_engine", user_backend("paged_engine", PagedLlamaEngine, dtypes=("float32",)), replace=True)
    return "paged_engine"


def judge(engine: Any, model: Path, case: Case, steps: int) -> dict[str, Any]:
    """One session: whether it failed, and for a bug whether it was found where it lives."""
    alternative = register_decode_bug(case.bug) if case.bug else case.alternative
    config = {"decode_steps": steps, "seed": case.seed, "input_shape": [2, 6],
              "isolate": "auto" if case.bug else False, "precision_diagnosis": False, **case.config}
    result = engine.run(engine.create_session(model, config, case.reference, alternative))
    out: dict[str, Any] = {"failed": not result.passed}
    if case.bug:
        spec, first, source = DECODE_BUGS[case.bug], result.first_divergence, result.error_source or {}
        checkpoint, step = spec.expected
        layer = int(checkpoint.split(":")[1]) if ":" in checkpoint else None
        out["localized"] = (first is not None and (str(first.key), first.step) == (checkpoint, step)
                            and all(r.passed for r in result.results if r.step == 0)
                            and source.get("kind") == spec.source and source.get("layer") == layer)
        out["where"] = None if first is None else f"{first.id} ({source.get('kind')})"
        out["confirmed"] = bool(source.get("confirmed"))
    return out


def run(seeds: int, steps: int, compiled: bool, match: str = "") -> dict[str, dict[str, list[Any]]]:
    """Every case (whose name contains ``match``); per case name, its outcomes over the seeds."""
    from debug_framework.backends import backend_availability
    from debug_framework.services.validation_engine import ValidationEngine

    _register_engine()
    compiled = compiled and backend_availability().get("inductor", (False, ""))[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-decode-diagnosis-"))
    engine = ValidationEngine(tmp / "bench.db")
    models: dict[tuple[str, int], Path] = {}
    outcomes: dict[str, dict[str, list[Any]]] = {}
    for case in _cases(seeds, compiled):
        if match not in case.name:
            continue
        key = (case.family, case.seed)
        if key not in models:
            models[key] = make_model(case.family, tmp / f"{case.family}{case.seed}", case.seed)
        start = time.perf_counter()
        got = judge(engine, models[key], case, steps)
        got["seconds"] = time.perf_counter() - start
        row = outcomes.setdefault(f"{case.name} [{case.family}]", {})
        for k, v in got.items():
            row.setdefault(k, []).append(v)
    return outcomes


def _count(values: list[bool]) -> str:
    return f"{sum(values)}/{len(values)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="models and inputs per case (default 5)")
    ap.add_argument("--steps", type=int, default=8, help="decode steps per session (default 8)")
    ap.add_argument("--no-compiled", action="store_true", help="skip the pytorch vs inductor pair")
    ap.add_argument("--match", default="", help="only the cases whose name contains this text (e.g. inductor)")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        ap.error("--seeds and --steps must be at least 1")
    start = time.perf_counter()
    outcomes = run(args.seeds, args.steps, not args.no_compiled, args.match)
    print(f"decode diagnosis: {args.seeds} seed(s), prefill + {args.steps} decode steps "
          f"({time.perf_counter() - start:.0f} s)")
    print(f"{'case':<62}{'false alarms':>13}{'detected':>10}{'localized':>10}{'confirmed':>10}{'s/session':>10}")
    fa, det, loc, conf = [], [], [], []
    for name, row in outcomes.items():
        secs = sum(row["seconds"]) / len(row["seconds"])
        if "localized" in row:
            det += row["failed"]
            loc += row["localized"]
            conf += row["confirmed"]
            print(f"{name:<62}{'':>13}{_count(row['failed']):>10}{_count(row['localized']):>10}"
                  f"{_count(row['confirmed']):>10}{secs:>10.1f}")
            missed = sorted({w for w, ok in zip(row["where"], row["localized"]) if not ok}, key=str)
            if missed:
                print(f"    found instead at: {', '.join(map(str, missed))}")
        else:
            fa += row["failed"]
            print(f"{name:<62}{_count(row['failed']):>13}{'':>10}{'':>10}{'':>10}{secs:>10.1f}")
    print(f"total: false alarms {_count(fa)}, detected {_count(det)}, localized {_count(loc)}, "
          f"source confirmed by a replay {_count(conf)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
