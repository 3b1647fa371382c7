"""Decode steps (issue 27): what validating one decode step costs, beside a plain ``transformers``
greedy decode of the same model in the same run.

* **plain greedy**: the model (a random Llama, ``--size tiny`` or ``small``) in float32, eager, one
  prefill then one token at a time through its own cache (``past_key_values``), argmax each step:
  the median seconds per decode step; and ``model.generate(..., do_sample=False)`` for the same
  number of new tokens, its seconds per token (prefill included).
* **the tool**: ``debug_validate --decode-steps N`` on the same model and inputs (reference
  ``float64_eager``, alternative ``pytorch`` float32, calibration at float32, no isolation): whole
  sessions with ``--steps-low`` and ``--steps-high`` decode steps; the difference of their median
  decode-stage times divided by the difference in steps is the tool's cost of one more decode step
  (three decodes, every checkpoint compared and judged, the KV cache compared per layer, the token
  metrics), and its ratio to one plain greedy step.

Nothing is asserted about time: the figures are printed (docs/benchmarks.md, "Decode steps").

    python -m benchmarks.bench_decode [--size tiny|small] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: random Llamas: tiny (the tests' size) and small (a few million parameters)
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, max_position_embeddings=128),
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=256),
}


def build(size: str, directory: Path, seed: int = 0) -> Path:
    """A random Llama of ``size`` saved under ``directory`` (safetensors, no tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    net = LlamaForCausalLM(LlamaConfig(**SIZES[size], rms_norm_eps=1e-6))
    net.save_pretrained(directory)
    return directory


def _inputs(vocab: int, batch: int, length: int, seed: int = 0) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen)


def plain_greedy(path: Path, batch: int, length: int, steps: int, repeats: int) -> dict[str, float]:
    """Median seconds of one greedy decode step through the model's own cache, and ``generate``'s
    seconds per new token, both in float32 eager ``transformers``."""
    import inspect

    import torch
    from transformers import LlamaForCausalLM

    net = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cache_arg = "cache" if "cache" in inspect.signature(net.forward).parameters else "past_key_values"

    def cache_of(out: Any) -> Any:
        return getattr(out, "cache", None) or out.past_key_values
    ids = _inputs(net.config.vocab_size, batch, length)
    mask = torch.ones_like(ids)
    per_step: list[float] = []
    per_token: list[float] = []
    with torch.inference_mode():
        for r in range(repeats + 1):  # the first round warms up
            out = net(input_ids=ids, attention_mask=mask, use_cache=True)
            cache, logits, m = cache_of(out), out.logits, mask
            times = []
            for _ in range(steps):
                tok = logits[:, -1].argmax(-1, keepdim=True)
                m = torch.cat([m, torch.ones_like(tok)], dim=1)
                start = time.perf_counter()
                out = net(input_ids=tok, attention_mask=m, use_cache=True, **{cache_arg: cache})
                times.append(time.perf_counter() - start)
                cache, logits = cache_of(out), out.logits
            start = time.perf_counter()
            net.generate(ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                         pad_token_id=0)
            if r:
                per_step.append(statistics.median(times))
                per_token.append((time.perf_counter() - start) / steps)
    return {"step_s": statistics.median(per_step), "generate_token_s": statistics.median(per_token)}


def tool(path: Path, root: Path, batch: int, length: int, steps: tuple[int, int], repeats: int) -> dict[str, Any]:
    """The tool's decode stage on the same model: median decode-stage seconds at each step count,
    the marginal seconds per decode step, and the whole session's seconds at the higher count."""
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(database_path=root / "decode.db")
    stage: dict[int, list[float]] = {n: [] for n in steps}
    session: list[float] = []
    per_side: dict[str, list[float]] = {"reference": [], "alternative": []}
    for r in range(repeats + 1):  # the first round warms imports and caches up
        for n in steps:
            config = {"model_tier": "generic", "decode_steps": n, "isolate": False, "precision_diagnosis": False,
                      "input_shape": [batch, length]}
            start = time.perf_counter()
            result = engine.run(engine.create_session(path, config, "float64_eager", "pytorch"))
            elapsed = time.perf_counter() - start
            if not result.passed:
                raise SystemExit(f"a correct pair failed at {n} decode steps: {result.first_divergence}")
            if r:
                stage[n].append(float(result.performance["decode_s"]))
                if n == steps[1]:
                    session.append(elapsed)
                    for side, secs in (result.decode or {}).get("seconds_per_step", {}).items():
                        per_side[side].append(float(secs))
    low, high = (statistics.median(stage[n]) for n in steps)
    return {"stage_s": {n: statistics.median(v) for n, v in stage.items()},
            "step_s": (high - low) / (steps[1] - steps[0]), "session_s": statistics.median(session),
            "pass_s": {side: statistics.median(v) for side, v in per_side.items() if v}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--steps-low", type=int, default=2)
    parser.add_argument("--steps-high", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 and 3 steps, one repeat")
    args = parser.parse_args(argv)
    size, repeats, steps = args.size, args.repeats, (args.steps_low, args.steps_high)
    if args.quick:
        size, repeats, steps = "tiny", 1, (1, 3)
    if not 0 < steps[0] < steps[1]:
        parser.error("need 0 < --steps-low < --steps-high")
    import torch

    torch.set_num_threads(1)  # one thread: the steadiest figures, the same for both sides
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = build(size, root / "llama")
        plain = plain_greedy(path, args.batch, args.length, steps[1], repeats)
        ours = tool(path, root, args.batch, args.length, steps, repeats)
    params = SIZES[size]
    print(f"random llama '{size}' ({params['num_hidden_layers']} layers, hidden {params['hidden_size']}, vocab "
          f"{params['vocab_size']}), batch {args.batch}, prompt {args.length}, 1 thread, median of {repeats}")
    print(f"plain transformers greedy: {plain['step_s'] * 1e3:.2f} ms per decode step (own cache loop); "
          f"generate(do_sample=False): {plain['generate_token_s'] * 1e3:.2f} ms per new token")
    print(f"debug_validate --decode-steps: decode stage {ours['stage_s'][steps[0]]:.3f} s at {steps[0]} step(s), "
          f"{ours['stage_s'][steps[1]]:.3f} s at {steps[1]}; whole session at {steps[1]}: {ours['session_s']:.3f} s")
    print(f"the tool per decode step: {ours['step_s'] * 1e3:.2f} ms = {ours['step_s'] / plain['step_s']:.1f}x a plain "
          f"greedy step (one pass inside it: reference {ours['pass_s'].get('reference', float('nan')) * 1e3:.2f} ms, "
          f"alternative {ours['pass_s'].get('alternative', float('nan')) * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
