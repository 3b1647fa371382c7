"""llama.cpp against our session on a real-shaped model: speed, and token metrics beside llama.cpp's own.

Writes a random decoder at Qwen2-0.5B's shape (24 layers, hidden 896, 14 query / 2 key-value
heads, MLP 4864, vocabulary 151936; about 494M parameters) as a Hugging Face directory and as a
Q8_0 GGUF (``write_gguf``), then in one run prints:

* llama.cpp's own forward time over the prompt (no eval callback; median of ``--repeats``);
* our session's time: ``--model-path HF_DIR --alternative-model FILE.gguf --dtype auto`` (reference,
  llama.cpp with every checkpoint captured, the calibration's emulation, isolation), and the ratio;
* our token metrics (``comparison.next_token_metrics``: mean KL divergence of the reference's
  distribution to llama.cpp's, Δp of the reference's top token, top-1 agreement) beside the same
  figures computed from llama.cpp's logits the way ``llama-perplexity --kl-divergence`` defines them
  (mean KLD over tokens, in float32; Δp of the *next* token of the text, here the next prompt token;
  same top p: how often the top tokens agree).

    python benchmarks/bench_llamacpp.py [--tokens 64] [--type q8_0] [--layers 24] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
             rope_theta=1000000.0, tie_word_embeddings=True)


def write_model(directory: Path, layers: int) -> Path:
    """A random Qwen2 at the 0.5B shape (``layers`` layers), float32 safetensors."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**{**SHAPE, "num_hidden_layers": layers})
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 + 0.05 * torch.randn(p.shape, generator=gen)) if "norm" in name
                    else 0.02 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(directory))
    return directory


def llama_forward_seconds(gguf: Path, ids: np.ndarray, repeats: int) -> tuple[float, np.ndarray]:
    """llama.cpp alone over the prompt (no eval callback): median seconds, and its logits ``[T, V]``."""
    from debug_framework.backends.llamacpp.graph import LlamaGraph, LlamaSettings

    graph = LlamaGraph(gguf, LlamaSettings())
    times, logits = [], None
    for _ in range(repeats):
        graph.open_context(1, len(ids) + 1, len(ids), observed=False)
        kept = graph.decode(ids, np.arange(len(ids)), np.zeros(len(ids), np.int64), frozenset())
        times.append(kept.seconds)
        logits = kept.logits
    graph.close()
    return statistics.median(times), np.asarray(logits)


def perplexity_tool_metrics(base: np.ndarray, test: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    """KLD, Δp and same-top-p as ``llama-perplexity --kl-divergence`` computes them (float32 softmax;
    Δp of the text's next token): base = the reference's logits, test = llama.cpp's."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lb, lt = log_softmax(base[:-1]), log_softmax(test[:-1])
    pb = np.exp(lb)
    kld = (pb * (lb - lt)).sum(-1)
    nxt = ids[1:]
    rows = np.arange(len(nxt))
    dp = np.exp(lt[rows, nxt]) - pb[rows, nxt]
    same = (base[:-1].argmax(-1) == test[:-1].argmax(-1)).mean()
    return {"kld_mean": float(kld.mean()), "delta_p_mean": float(dp.mean()), "delta_p_rms": float(np.sqrt((dp ** 2).mean())),
            "same_top_p": float(same)}


def _stage_seconds(result: object) -> list[tuple[str, float]]:
    """The session's wall time per stage (``performance.stage_s``), and the calibration's
    preparation (re-quantizing the weights) within it."""
    performance = getattr(result, "performance", {}) or {}
    stages = performance.get("stage_s") or {}
    out = [(str(name), float(seconds)) for name, seconds in stages.items() if float(seconds) >= 0.05]
    prepare = (performance.get("calibration") or {}).get("prepare_s")
    if prepare is not None:
        out.append(("(calibration's preparation)", float(prepare)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--type", default="q8_0", help="the GGUF's tensor type (f32, f16, q8_0, q4_0 ...)")
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="keep the written model here (default: a temporary folder)")
    args = parser.parse_args()

    from debug_framework.backends.python_reference import PythonReferenceBackend
    from debug_framework.comparison.next_token import next_token_metrics
    from debug_framework.modelio import ModelInputs, load_model
    from debug_framework.backends.llamacpp.convert import write_gguf
    from debug_framework.services.validation_engine import ValidationEngine

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_llamacpp_"))
    start = time.perf_counter()
    hf = work / "hf"
    if not (hf / "config.json").exists():
        write_model(hf, args.layers)
    gguf = work / f"model-{args.type}.gguf"
    if not gguf.exists():
        write_gguf(hf, gguf, tensor_type=args.type)
    print(f"model: Qwen2 shape, {args.layers} layers, {args.type} GGUF {gguf.stat().st_size / 1e6:.0f} MB "
          f"(written in {time.perf_counter() - start:.0f} s), {args.tokens} tokens")

    inputs = ModelInputs.random(SHAPE["vocab_size"], 1, args.tokens, seed=0, pad_lengths=[0])
    ids = np.asarray(inputs.input_ids[0], np.int64)
    own_s, llama_logits = llama_forward_seconds(gguf, ids, args.repeats)
    print(f"llama.cpp's own forward: {own_s * 1e3:.0f} ms (median of {args.repeats})")

    engine = ValidationEngine(work / "sessions.db")
    start = time.perf_counter()
    sid = engine.create_session(hf, {"input_shape": [1, args.tokens], "pad_lengths": [0], "dtype": "auto",
                                     "alternative_options": {"model_file": str(gguf)}},
                                alternative_backend="llamacpp", reference_backend="python_reference")
    result = engine.run(sid)
    session_s = time.perf_counter() - start
    print(f"our session: {session_s:.1f} s ({session_s / own_s:.0f}x llama.cpp's forward); passed={result.passed}")
    print("  stages: " + ", ".join(f"{name} {float(seconds):.1f} s" for name, seconds in _stage_seconds(result)))

    ref = PythonReferenceBackend()
    ref.prepare(load_model(hf), "float64")
    base = np.asarray(ref.run(inputs, ["post_processing"]).tensors[("post_processing", None)], np.float64)[0]
    ours = next_token_metrics(base[None], llama_logits[None].astype(np.float64))
    theirs = perplexity_tool_metrics(base, llama_logits, ids)
    print(f"{'':24}{'ours':>14}{'llama-perplexity way':>24}")
    print(f"{'mean KL divergence':24}{ours.kl_divergence['mean']:>14.3e}{theirs['kld_mean']:>24.3e}")
    print(f"{'Δp (mean)':24}{ours.delta_p['mean']:>14.3e}{theirs['delta_p_mean']:>24.3e}"
          "   (ours: of the reference's top token; theirs: of the next token)")
    print(f"{'same top-1':24}{ours.top1_agreement:>14.3f}{theirs['same_top_p']:>24.3f}")


if __name__ == "__main__":
    main()
