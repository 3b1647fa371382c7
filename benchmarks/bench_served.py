"""What validating a served model costs its server, in one run against a local ``llama-server``.

A tiny Llama (or ``--model-path HF_DIR``: a Llama, Mistral, Qwen2 or Qwen3 directory) is written as a
GGUF and served by llama.cpp's ``llama-server`` (the xllamacpp wheel, float32 throughout); then

* **ours**: ``debug_validate --alternative-endpoint`` (the served stage alone is timed: its requests,
  their wall time, the positions answered);
* **bare**: the server answering the same prompts with plain completions (each row's prompt ids,
  ``max_tokens`` the decode steps, ``temperature`` 0, no log-probabilities), at the same concurrency;

and prints both, with the ratio of ours to the bare requests.

    python -m benchmarks.bench_served [--model-path HF_DIR] [--batch 2] [--length 16] [--decode-steps 4]
                                      [--concurrency 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["tiny_llama", "bare_completions", "main"]


def tiny_llama(directory: Path, seed: int = 0) -> Path:
    """A tiny random Llama (2 layers, 4/2 heads of 8, vocabulary 96, weights N(0, 0.3)) saved as a
    Hugging Face directory: large enough logits that a bug shows in the next-token distributions."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(directory))
    return directory


def bare_completions(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[float, int]:
    """``(seconds, requests)``: the server answering ``prompts`` (token ids) with plain completions."""
    import httpx

    with httpx.Client(timeout=60.0) as client:
        def one(prompt: list[int]) -> None:
            answer = client.post(url + "/completions", json={"prompt": prompt, "max_tokens": max(1, max_tokens),
                                                             "temperature": 0.0, "cache_prompt": False})
            answer.raise_for_status()

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            list(pool.map(one, prompts))
        return time.perf_counter() - started, len(prompts)


def _validate(model_dir: Path, url: str, db: Path, args: argparse.Namespace) -> dict[str, object]:
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(config={"database_path": str(db)})
    config = {"alternative_endpoint": url, "dtype": "float32", "input_shape": [args.batch, args.length],
              "pad_lengths": [0] * args.batch, "decode_steps": args.decode_steps, "concurrency": args.concurrency}
    started = time.perf_counter()
    sid = engine.create_session(str(model_dir), config)
    result = engine.run(sid)
    wall = time.perf_counter() - started
    served = (result.decode or {}).get("served") or {}
    return {"verdict": result.verdict, "wall_s": wall, "served_s": served.get("seconds"),
            "requests": served.get("requests"), "positions": served.get("positions"), "session": sid}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_served", description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", type=Path, help="a Hugging Face directory (default: a tiny Llama)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--decode-steps", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="bare runs (the best is kept)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    from debug_framework.backends.llamacpp.convert import write_gguf
    from debug_framework.modelio.inputs import ModelInputs
    from debug_framework.services.validation_engine import ValidationEngine

    from .llama_server import serving

    with tempfile.TemporaryDirectory(prefix="bench_served_") as tmp:
        root = Path(tmp)
        model_dir = args.model_path or tiny_llama(root / "hf")
        gguf = write_gguf(model_dir, root / "model.gguf")
        with serving(gguf, slots=max(4, args.concurrency)) as url:
            ours = _validate(model_dir, url, root / "bench.db", args)
            engine = ValidationEngine(config={"database_path": str(root / "bench.db")})
            row = engine.db.sessions.get(str(ours["session"]))  # the session's own inputs, as it saved them
            inputs = ModelInputs.load(str(row["inputs_ref"]))  # type: ignore[index]
            prompts = [[int(t) for t in ids] for ids in inputs.input_ids]
            bare = min((bare_completions(url, prompts, args.decode_steps, args.concurrency)
                        for _ in range(max(1, args.repeats))), key=lambda r: r[0])
    figures = {"model": str(args.model_path or "tiny llama"), "batch": args.batch, "length": args.length,
               "decode_steps": args.decode_steps, "concurrency": args.concurrency, "verdict": ours["verdict"],
               "requests": ours["requests"], "positions": ours["positions"], "served_s": ours["served_s"],
               "validation_wall_s": ours["wall_s"], "bare_requests": bare[1], "bare_s": bare[0],
               "ratio_served_to_bare": (ours["served_s"] or 0.0) / bare[0] if bare[0] else None}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"model {figures['model']}: {args.batch} row(s) x {args.length} tokens, {args.decode_steps} decode step(s), "
          f"concurrency {args.concurrency}; verdict {ours['verdict']}")
    print(f"ours: {ours['requests']} requests for {ours['positions']} positions in {ours['served_s']:.3f} s "
          f"(the whole validation {ours['wall_s']:.2f} s)")
    print(f"bare: {bare[1]} plain completions of the same prompts in {bare[0]:.3f} s")
    print(f"ratio ours / bare: {figures['ratio_served_to_bare']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
