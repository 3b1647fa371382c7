"""The op-level drill-down on every injected bug, beside a "mark-all" comparison, in one run.

Every injected bug of :mod:`benchmarks.injected_bugs` (one layer each, tiny Llama / Qwen2 / BERT,
float32 and bfloat16 alternatives) and the correct module backend is drilled at the buggy layer
(:data:`BUG_LAYER`) on the float64 reference's input to it:

* ours (``replay``): the operators that introduce error on their own (replayed alone on the
  trusted inputs to them) and the culprit, the first of them;
* the anchor, a mark-all comparison (every operator's values in the alternative's own run of the
  layer compared against float64, as Polygraphy's mark-all does): the operators whose inputs in
  that run are already beyond the operator's bound, or whose output is (the ones ours flags).

    python -m benchmarks.bench_drilldown [--family bert ...] [--bug gelu_variant ...]

Printed per case: culprit op and module path, how many operators each method flags, the time of
one layer's drill-down. Nothing is asserted (tests/drilldown holds the acceptance checks).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.injected_bugs import BUG_LAYER, CORE_FAMILIES, cases, register_bug_backend  # noqa: E402
from benchmarks.models.tiny_transformers import make_model  # noqa: E402


def drill(model_dir: Path, bug: str | None, dtype: str, out: Path) -> tuple[object, float]:
    """One layer's drill-down of the ``bug`` backend: ``(LayerDrilldown, seconds)``."""
    from debug_framework.backends import get_backend
    from debug_framework.modelio import ModelInputs, load_model
    from debug_framework.services.drilldown import DrillRequest, choose_strategy

    model = load_model(model_dir)
    inputs = ModelInputs.random(model.config.vocab_size, 2, 16, seed=0, pad_lengths=[0, 4])
    ref = get_backend("python_reference")
    ref.prepare(model, "float64")
    hidden = ref.run(inputs, capture_layer_inputs=True).layer_inputs[BUG_LAYER]
    alt = get_backend(register_bug_backend(bug))
    alt.prepare(model, dtype)
    strategy, why = choose_strategy(alt)
    if strategy is None:
        raise SystemExit(why)
    start = time.perf_counter()
    entry = strategy.drill(DrillRequest(layer=BUG_LAYER, checkpoint=f"layer {BUG_LAYER}", backend=alt, model=model,
                                        inputs=inputs, hidden_in=hidden, dtype=dtype, device="cpu", out_dir=out))
    return entry, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append")
    parser.add_argument("--bug", action="append")
    args = parser.parse_args()
    todo = [(b, f, d) for b, f, d in cases(None if args.family else CORE_FAMILIES) if (not args.family or f in args.family) and (not args.bug or b in args.bug)]
    families = sorted({f for _, f, _ in todo})
    todo += [(None, f, d) for f in families for d in ("float32", "bfloat16")]
    with tempfile.TemporaryDirectory() as tmp:
        models = {f: make_model(f, Path(tmp) / f, 0) for f in families}
        print(f"{'bug':28s} {'family':6s} {'dtype':8s} | {'culprit (ours: replay)':58s} {'ours':>4s} "
              f"{'mark-all':>8s} | {'time s':>6s}")
        for i, (bug, family, dtype) in enumerate(todo):
            entry, seconds = drill(models[family], bug, dtype, Path(tmp) / f"case{i}")
            c = entry.culprit
            named = "-" if c is None else f"{c.op} @ {c.module_path.removeprefix('model.').removeprefix('encoder.')}"
            mark_all = sum(1 for r in entry.operators if r.introduces or r.carried_in > r.bound)
            print(f"{bug or '(correct)':28s} {family:6s} {dtype:8s} | {named[:58]:58s} {len(entry.introducing):4d} "
                  f"{mark_all:8d} | {seconds:6.2f}")


if __name__ == "__main__":
    main()
