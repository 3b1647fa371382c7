"""ExecuTorch on one model, in one run: the export time, the program's own run time, our session's
time, and ExecuTorch's Inspector (``calculate_numeric_gap``) time and result where it runs.

Model: a tiny random Llama (``--layers`` layers, hidden ``--hidden``, 4 heads; ``--kv-heads 2`` for
grouped-query attention), inputs 2 x 16 tokens (the second row padded by 4), float32, CPU. For each
delegate (portable, XNNPACK):

* export: ``torch.export`` + the lowering of the model with every checkpoint an output (seconds);
* program run: the median of the program's own ``forward`` (ExecuTorch's runtime alone), and the
  same model in eager PyTorch for scale (the anchor);
* session: a whole ``ValidationEngine`` session (``--no-isolate``), the export included, and its verdict;
* Inspector: the model exported again with an ETRecord, run with an ETDump, and
  ``calculate_numeric_gap("MSE")``: its seconds and its largest gap, or the line where it fails.

Measures and prints; asserts nothing.

    python benchmarks/bench_executorch.py [--layers 2] [--hidden 32] [--kv-heads 4] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from debug_framework.modelio import ModelInputs, load_model  # noqa: E402


def make_llama(directory: Path, layers: int, hidden: int, kv_heads: int) -> Path:
    """A tiny random Llama saved with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=hidden // 4,
                      max_position_embeddings=64)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(directory))
    return directory


def _median_run(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model_dir: Path, delegate: str, repeats: int, work: Path) -> dict[str, object]:
    """The four figures for one delegate."""
    from debug_framework.backends import get_backend
    from debug_framework.backends._graph_capture import PlainOutput, graph_inputs
    from debug_framework.backends.executorch.inspector import numeric_gap
    from debug_framework.services.validation_engine import ValidationEngine

    model = load_model(model_dir)
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=16, seed=0, pad_lengths=[0, 4])
    backend = get_backend("executorch", delegate=delegate, artifact_dir=work / delegate)
    backend.prepare(model.fork())
    backend.run(inputs)  # exports
    export = backend.exports[0]
    program_s = _median_run(lambda: backend.run(inputs), repeats)
    eager = PlainOutput(backend.net)
    feeds = {k: torch.from_numpy(v) for k, v in graph_inputs(model, inputs).items()}
    with torch.no_grad():
        eager_s = _median_run(lambda: eager(**feeds), repeats)

    engine = ValidationEngine(work / f"{delegate}.db")
    start = time.perf_counter()
    sid = engine.create_session(model_dir, {"isolate": False, "alternative_options": {"delegate": delegate}},
                                "auto", "executorch")
    result = engine.run(sid)
    session_s = time.perf_counter() - start

    args = tuple(feeds.values())
    evidence = numeric_gap(PlainOutput(backend.net), args, work / f"inspector-{delegate}.pte", delegate)
    return {"delegate": delegate, "export_s": export["export_s"] + export["lower_s"], "program_s": program_s,
            "eager_s": eager_s, "session_s": session_s, "verdict": result.verdict,
            "worst_margin": max(r.to_dict().get("margin") or 0.0 for r in result.results),
            "inspector": evidence}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4, help="2: grouped-query attention (4 query heads)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--delegates", default="portable,xnnpack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-executorch-") as tmp:
        work = Path(tmp)
        model_dir = make_llama(work / "hf", args.layers, args.hidden, args.kv_heads)
        print(f"tiny Llama: {args.layers} layers, hidden {args.hidden}, 4 heads / {args.kv_heads} kv heads; "
              f"inputs 2 x 16; {os.cpu_count()} CPUs")
        print(f"{'delegate':<9} {'export s':>9} {'program ms':>11} {'eager ms':>9} {'session s':>10} "
              f"{'verdict':>8} {'worst margin':>13}  Inspector")
        for delegate in args.delegates.split(","):
            row = measure(model_dir, delegate, args.repeats, work)
            inspector = row["inspector"]
            print(f"{delegate:<9} {row['export_s']:>9.2f} {1e3 * row['program_s']:>11.3f} {1e3 * row['eager_s']:>9.3f} "
                  f"{row['session_s']:>10.2f} {row['verdict']:>8} {row['worst_margin']:>13.3f}  {inspector.line()}")


if __name__ == "__main__":
    main()
