"""What isolation costs a session whose alternative is ``onnxruntime``, on a tiny model.

Model: a random Llama (``--layers`` layers, default 4; hidden 64, 4 query / 2 key-value heads),
saved with ``save_pretrained`` into a temporary directory; inputs 2 x 16 tokens; reference
``pytorch``, alternative ``onnxruntime``, float32. Each variant is a fresh session (``create_session``
plus ``run``, wall time), so each pays its own export of the model:

* ``no isolation``: the anchor;
* ``isolation``: every layer replayed from the model's export, cut at the layer's boundaries
  (``layer_replay="graph"``, the default);
* ``isolation, re-export``: every layer exported alone, as before (``layer_replay="export"``;
  ``--no-legacy`` skips it).

The variants are interleaved ``--repeats`` times (default 3) and the medians printed side by side
with their ratio to the anchor and the isolation stage's own time. Measures and prints; asserts
nothing. Everything is written under a temporary directory, removed at the end.

    python -m benchmarks.bench_isolation [--repeats 3] [--layers 4] [--no-legacy]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from debug_framework.services.validation_engine import ValidationEngine  # noqa: E402


def _tiny_llama(directory: Path, layers: int) -> Path:
    """A random Llama decoder saved with ``save_pretrained`` (safetensors + config)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(str(directory))
    return directory


def _session(engine: ValidationEngine, model: Path, isolate: bool, layer_replay: str) -> tuple[float, float]:
    """One session's wall time (create + run) and its isolation stage's time (0 without isolation)."""
    config = {"isolate": isolate, "input_shape": [2, 16], "alternative_options": {"layer_replay": layer_replay}}
    start = time.perf_counter()
    sid = engine.create_session(model, config, "pytorch", "onnxruntime")
    result = engine.run(sid)
    wall = time.perf_counter() - start
    return wall, float(result.performance.get("isolation_s", 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--no-legacy", action="store_true", help="skip the former per-layer re-export")
    args = parser.parse_args()
    variants = [("no isolation", False, "graph"), ("isolation", True, "graph")]
    if not args.no_legacy:
        variants.append(("isolation, re-export", True, "export"))
    work = Path(tempfile.mkdtemp(prefix="df-bench-isolation-"))
    try:
        model = _tiny_llama(work / "model", args.layers)
        engine = ValidationEngine(work / "db" / "bench.db")
        walls: dict[str, list[float]] = {name: [] for name, *_ in variants}
        stages: dict[str, list[float]] = {name: [] for name, *_ in variants}
        for _ in range(args.repeats):  # interleaved, so machine noise hits every variant alike
            for name, isolate, replay in variants:
                wall, iso = _session(engine, model, isolate, replay)
                walls[name].append(wall)
                stages[name].append(iso)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    anchor = statistics.median(walls["no isolation"])
    print(f"tiny Llama, {args.layers} layers, 2 x 16 tokens, pytorch vs onnxruntime, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, median of {args.repeats} sessions each")
    print(f"{'session':<24}{'wall s':>9}{'isolation stage s':>19}{'vs no isolation':>17}")
    for name, *_ in variants:
        wall = statistics.median(walls[name])
        print(f"{name:<24}{wall:>9.2f}{statistics.median(stages[name]):>19.2f}{wall / anchor:>16.2f}x")
    print("anchor: the same session without isolation = 1.00x")


if __name__ == "__main__":
    main()
