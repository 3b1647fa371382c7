"""ExecuTorch on one model, in one run: the export time, the program's own run time, our session's
time, and ExecuTorch's Inspector (``calculate_numeric_gap``) time and result where it runs.

Model: a tiny random Llama (``--layers`` layers, hidden ``--hidden``, 4 heads; ``--kv-heads 2`` for
grouped-query attention), inputs 2 x 16 tokens (the second row padded by 4), float32, CPU. For each
delegate (portable, XNNPACK):

* export: ``torch.export`` + the lowering of the model with every checkpoint an output (seconds);
* program run: the median of the program's own ``forward`` (ExecuTorch's runtime alone), and the
  same model in eager PyTorch for scale (the anchor);
* session: a whole ``ValidationEngine`` session (``--no-isolate``), the export included, and its verdict;
* Inspector: the model (logits alone) exported again with an ETRecord, run with an ETDump, and
  ``calculate_numeric_gap("MSE")``, on the session's inputs (batch 2) and on their first row alone
  (batch 1): its seconds, how many operators it compared and its largest gap, or the line where it
  fails;
* decode (``--decode-steps N``, 0 to skip): the static-cache program (methods ``prefill`` and
  ``decode``) exported and lowered (seconds), the median of its own ``decode`` call (one token per
  row: ExecuTorch's runtime alone), the same step in eager PyTorch through its ``DynamicCache`` (the
  anchor), and a whole session with ``decode_steps: N`` (both exports included), its median wall
  time per decode step (the three decodes and the judgement) and its verdict.

Each delegate is measured in a child interpreter of its own (a crash in one is reported, the other
still measured).
Measures and prints; asserts nothing.

    python benchmarks/bench_executorch.py [--layers 2] [--hidden 32] [--kv-heads 4] [--repeats 20] [--decode-steps 4]
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


class _Logits(torch.nn.Module):
    """The model's logits for (input_ids, attention_mask): what the Inspector is given."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def measure_decode(model_dir: Path, delegate: str, steps: int, work: Path) -> dict[str, object]:
    """The decode figures for one delegate: the static-cache program's export, its own step, the
    eager step, and a session decoding ``steps`` tokens."""
    import numpy as np

    from debug_framework.backends import get_backend
    from debug_framework.backends.pytorch import build_hf_model
    from debug_framework.services.validation_engine import ValidationEngine

    model = load_model(model_dir)
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=16, seed=0, pad_lengths=[0, 4],
                               padding_side="left").with_positions()
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, steps))
    backend = get_backend("executorch", delegate=delegate, artifact_dir=work / f"{delegate}-decode")
    backend.prepare(model.fork())
    for _ in backend.iter_decode(inputs, steps, None, tokens):
        pass
    export = next(e for e in backend.exports if str(e["variant"]).startswith("decode"))
    program_step_s = statistics.median(backend.decode_seconds[1:])

    net = build_hf_model(model.fork(), torch.float32, "cpu")
    feeds = inputs.torch()
    eager_steps = []
    with torch.no_grad():
        out = net(**feeds, use_cache=True)
        mask = feeds["attention_mask"]
        position = feeds.get("position_ids", torch.arange(16).expand(2, 16))[:, -1:]
        for s in range(steps):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
            start = time.perf_counter()
            out = net(input_ids=torch.from_numpy(tokens[:, s:s + 1]), attention_mask=mask, position_ids=position + s + 1,
                      past_key_values=out.past_key_values, use_cache=True)
            eager_steps.append(time.perf_counter() - start)

    engine = ValidationEngine(work / f"{delegate}-decode.db")
    start = time.perf_counter()
    sid = engine.create_session(model_dir, {"isolate": False, "decode_steps": steps, "padding_side": "left",
                                            "pad_lengths": [0, 4], "alternative_options": {"delegate": delegate}},
                                "auto", "executorch")
    result = engine.run(sid)
    session_s = time.perf_counter() - start
    return {"decode_export_s": export["export_s"] + export["lower_s"], "program_step_s": program_step_s,
            "eager_step_s": statistics.median(eager_steps), "decode_session_s": session_s,
            "session_step_s": statistics.median(result.summary()["decode"]["step_wall_s"]),
            "decode_verdict": result.verdict}


def measure(model_dir: Path, delegate: str, repeats: int, work: Path) -> dict[str, object]:
    """The figures for one delegate."""
    from debug_framework.backends import get_backend
    from debug_framework.backends._graph_capture import PlainOutput, graph_inputs
    from debug_framework.backends.executorch.inspector import numeric_gap
    from debug_framework.backends.pytorch import build_hf_model
    from debug_framework.services.validation_engine import ValidationEngine

    model = load_model(model_dir)
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=16, seed=0, pad_lengths=[0, 4])
    backend = get_backend("executorch", delegate=delegate, artifact_dir=work / delegate)
    backend.prepare(model.fork())
    backend.run(inputs)  # exports
    export = backend.exports[0]
    program_s = _median_run(lambda: backend.run(inputs), repeats)
    net = build_hf_model(model.fork(), torch.float32, "cpu")
    eager = PlainOutput(net)
    feeds = {k: torch.from_numpy(v) for k, v in graph_inputs(model, inputs).items()}
    with torch.no_grad():
        eager_s = _median_run(lambda: eager(**feeds), repeats)

    engine = ValidationEngine(work / f"{delegate}.db")
    start = time.perf_counter()
    sid = engine.create_session(model_dir, {"isolate": False, "alternative_options": {"delegate": delegate}},
                                "auto", "executorch")
    result = engine.run(sid)
    session_s = time.perf_counter() - start

    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    inspector = {f"batch {len(a[0])}": numeric_gap(_Logits(net).eval(), a, work / f"inspector-{delegate}-{len(a[0])}.pte",
                                                   delegate).line()
                 for a in ((ids, mask), (ids[:1], mask[:1]))}
    return {"delegate": delegate, "export_s": export["export_s"] + export["lower_s"], "program_s": program_s,
            "eager_s": eager_s, "session_s": session_s, "verdict": result.verdict,
            "worst_margin": max(r.to_dict().get("margin") or 0.0 for r in result.results), "inspector": inspector}


def _in_child(args: argparse.Namespace, delegate: str) -> dict[str, object] | str:
    """:func:`measure` for ``delegate`` in a child interpreter: its row, or why there is none."""
    import json
    import subprocess
    import sys

    command = [sys.executable, __file__, "--one", delegate, "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--kv-heads", str(args.kv_heads), "--repeats", str(args.repeats), "--decode-steps", str(args.decode_steps)]
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("ROW:")), None)
    if line is None:
        tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
        return f"{delegate}: no result (exit {done.returncode}): {tail}"
    return json.loads(line.removeprefix("ROW:"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4, help="2: grouped-query attention (4 query heads)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--delegates", default="portable,xnnpack")
    parser.add_argument("--decode-steps", type=int, default=4, help="0: no decode figures")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one delegate, one JSON row
    args = parser.parse_args()
    if args.one is not None:
        import json

        with tempfile.TemporaryDirectory(prefix="bench-executorch-") as tmp:
            work = Path(tmp)
            model_dir = make_llama(work / "hf", args.layers, args.hidden, args.kv_heads)
            row = measure(model_dir, args.one, args.repeats, work)
            if args.decode_steps:
                row.update(measure_decode(model_dir, args.one, args.decode_steps, work))
            print("ROW:" + json.dumps(row))
        return
    print(f"tiny Llama: {args.layers} layers, hidden {args.hidden}, 4 heads / {args.kv_heads} kv heads; "
          f"inputs 2 x 16 (row 2 padded by 4); {os.cpu_count()} CPUs")
    print(f"{'delegate':<9} {'export s':>9} {'program ms':>11} {'eager ms':>9} {'session s':>10} {'verdict':>8} "
          f"{'worst margin':>13}")
    rows = [_in_child(args, d) for d in args.delegates.split(",")]
    for row in rows:
        if isinstance(row, str):
            print(row)
            continue
        print(f"{row['delegate']:<9} {row['export_s']:>9.2f} {1e3 * row['program_s']:>11.3f} "
              f"{1e3 * row['eager_s']:>9.3f} {row['session_s']:>10.2f} {row['verdict']:>8} {row['worst_margin']:>13.3f}")
        for batch, line in row["inspector"].items():
            print(f"    {batch}: {line}")
        if "decode_export_s" in row:
            print(f"    decode ({args.decode_steps} steps): static-cache program export {row['decode_export_s']:.2f} s, "
                  f"its step {1e3 * row['program_step_s']:.3f} ms (eager {1e3 * row['eager_step_s']:.3f} ms); session "
                  f"{row['decode_session_s']:.2f} s, {1e3 * row['session_step_s']:.1f} ms per step, {row['decode_verdict']}")


if __name__ == "__main__":
    main()
