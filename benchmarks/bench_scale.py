"""Memory and time at real sizes: the tool beside a plain ``transformers`` load and forward, in one run.

For each size, a Llama-shaped model with random bfloat16 weights is written by this benchmark
(config.json + one model.safetensors, tensor by tensor, so writing never holds the model): as Llama,
whose reference is written from the math, or with ``--family olmo2`` as OLMo-2, whose reference is
the generic tier's ``float64_eager`` (the same shapes with OLMo-2's norms). Then, each in a fresh
process:

* **plain** (the anchor): ``AutoModelForCausalLM.from_pretrained(path, dtype=...)`` and one forward
  pass on the tool's default inputs (2 x 16 random token ids);
* **tool**: ``debug_validate --model-path path --alternative-backend pytorch`` at its defaults
  (``--dtype`` when given), on a fresh database.

Wall time and peak resident memory come from the kernel for each child (``os.wait4``'s rusage:
``ru_maxrss``, the whole process's high-water mark, file pages touched included). Printed side
by side: both, their ratios (tool / plain) and the tool's peak bytes per parameter. Nothing is
asserted. Sizes (``--sizes``, default ``0.1B,0.5B,1.2B``; ``--with-8b`` adds the Llama-3-8B shape, whose
plain float32 load needs 29.9 GiB for its weights alone: on a machine with less memory the benchmark
refuses it unless ``--dtype bfloat16``, and says so beside the figures):

| name | shape | parameters |
| --- | --- | --- |
| 0.1B | hidden 768, MLP 2048, 12 layers, 12/4 heads, vocab 32000, untied head | 0.125B |
| 0.5B | hidden 1024, MLP 2816, 24 layers, 16/8 heads, vocab 128256, untied head | 0.55B |
| 1.2B | Llama-3.2-1B: hidden 2048, MLP 8192, 16 layers, 32/8 heads, vocab 128256, tied head | 1.24B |
| 8B | Llama-3-8B: hidden 4096, MLP 14336, 32 layers, 32/8 heads, vocab 128256, untied head | 8.03B |

    python -m benchmarks.bench_scale [--sizes 0.1B,0.5B] [--with-8b] [--dtype bfloat16] [--family olmo2]
                                     [--keep DIR] [--json]
                                     [--tool-args=--no-isolate]

The models are written under a temporary directory (removed at the end) or ``--keep DIR``
(kept and reused by later runs). Disk: about 2 bytes per parameter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: name -> (hidden, MLP width, layers, query heads, key/value heads, vocabulary, tied head)
SHAPES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "0.1B": (768, 2048, 12, 12, 4, 32000, False),
    "0.5B": (1024, 2816, 24, 16, 8, 128256, False),
    "1.2B": (2048, 8192, 16, 32, 8, 128256, True),
    "8B": (4096, 14336, 32, 32, 8, 128256, False),
}


#: the families a shape is written as: ``llama`` (a reference written from the math judges it) and
#: ``olmo2`` (no such reference: the generic tier's ``float64_eager`` judges it; norms after each
#: block and on the queries and keys, no norm before a block)
FAMILIES = ("llama", "olmo2")


def tensor_shapes(name: str, family: str = "llama") -> dict[str, tuple[int, ...]]:
    """The Hugging Face tensors of the shape ``name`` as ``family`` writes them, in file order."""
    hidden, mlp, layers, heads, kv, vocab, tied = SHAPES[name]
    head_dim = hidden // heads
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        if family == "olmo2":
            out |= {p + "post_feedforward_layernorm.weight": (hidden,), p + "self_attn.q_norm.weight": (heads * head_dim,),
                    p + "self_attn.k_norm.weight": (kv * head_dim,)}
        else:
            out[p + "input_layernorm.weight"] = (hidden,)
        out |= {p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": (kv * head_dim, hidden),
                p + "self_attn.v_proj.weight": (kv * head_dim, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": (mlp, hidden), p + "mlp.up_proj.weight": (mlp, hidden),
                p + "mlp.down_proj.weight": (hidden, mlp)}
    out["model.norm.weight"] = (hidden,)
    if not tied:
        out["lm_head.weight"] = (vocab, hidden)
    return out


def parameters(name: str, family: str = "llama") -> int:
    total = 0
    for shape in tensor_shapes(name, family).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def write_model(name: str, directory: Path, seed: int = 0, family: str = "llama") -> Path:
    """Config and bfloat16 safetensors of shape ``name`` as ``family`` in ``directory`` (kept when
    already there), written one tensor at a time: norms 1, every other weight N(0, 0.02)."""
    import torch

    done = directory / ".complete"
    if done.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    hidden, mlp, layers, heads, kv, vocab, tied = SHAPES[name]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": mlp, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hidden // heads, "vocab_size": vocab,
              "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "tie_word_embeddings": tied, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    if family == "olmo2":
        config |= {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "pad_token_id": 1,
                   "bos_token_id": None, "eos_token_id": 2}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    shapes = tensor_shapes(name, family)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor, shape in shapes.items():
        size = 2
        for d in shape:
            size *= d
        header[tensor] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    gen = torch.Generator().manual_seed(seed)
    with open(directory / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for tensor, shape in shapes.items():
            if tensor.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            fh.write(t.view(torch.int16).numpy().tobytes())
            del t
    done.write_text("ok")
    return directory


_PLAIN = """
import sys, torch, transformers
path, dtype = sys.argv[1], getattr(torch, sys.argv[2])
net = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
ids = torch.randint(0, net.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    net(input_ids=ids, attention_mask=torch.ones_like(ids))
"""


def measure(cmd: list[str], *, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` as a child: its wall seconds, peak RSS (bytes, the kernel's) and exit code."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = proc.communicate()  # reads both pipes, then reaps the child
    wall = time.perf_counter() - start
    import resource

    # the largest peak of the children waited for: run alone (_measure_alone), this child's
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"seconds": wall, "peak_bytes": peak, "exit": proc.returncode, "stderr": err.decode()[-2000:],
            "stdout": out.decode()}


def _measure_alone(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """:func:`measure` in a fresh Python process, so ``RUSAGE_CHILDREN`` holds this child alone."""
    code = ("import json, sys; from benchmarks.bench_scale import measure; "
            "print(json.dumps(measure(json.loads(sys.argv[1]))))")
    root = str(Path(__file__).resolve().parent.parent)
    res = subprocess.run([sys.executable, "-c", code, json.dumps(cmd)], capture_output=True, text=True, env=env,
                         cwd=root, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_size(name: str, root: Path, dtype: str | None, tool_args: list[str] | None = None,
             family: str = "llama") -> dict[str, Any]:
    """Plain and tool figures for one size (``tool_args``: more ``debug_validate`` options)."""
    path = write_model(name, root / (name if family == "llama" else f"{name}-{family}"), family=family)
    n = parameters(name, family)
    env = dict(os.environ)
    plain = _measure_alone([sys.executable, "-c", _PLAIN, str(path), dtype or "float32"], env)
    with tempfile.TemporaryDirectory() as scratch:
        cmd = [sys.executable, "-m", "debug_framework.cli.debug_validate", "--model-path", str(path),
               "--alternative-backend", "pytorch", "--database", str(Path(scratch) / "db.sqlite"), "--json"]
        if dtype:
            cmd += ["--dtype", dtype]
        tool = _measure_alone(cmd + list(tool_args or []), env)
    verdict, memory, stages = None, None, None
    try:
        doc = json.loads(tool["stdout"])
        verdict = doc.get("verdict")
        performance = doc.get("performance") or {}
        memory, stages = performance.get("memory"), performance.get("stage_s")
    except (ValueError, AttributeError):
        pass
    return {"size": name, "family": family, "parameters": n, "dtype": dtype or "float32", "tool_args": list(tool_args or []),
            "plain": _brief(plain), "tool": _brief(tool),
            "verdict": verdict, "tool_memory": memory,
            "tool_stage_s": {k: round(v, 2) for k, v in (stages or {}).items()},
            "ratio_peak": tool["peak_bytes"] / plain["peak_bytes"], "ratio_seconds": tool["seconds"] / plain["seconds"],
            "tool_bytes_per_parameter": tool["peak_bytes"] / n, "plain_bytes_per_parameter": plain["peak_bytes"] / n}


def _brief(m: dict[str, Any]) -> dict[str, Any]:
    out = {"seconds": round(m["seconds"], 2), "peak_bytes": m["peak_bytes"], "exit": m["exit"]}
    if m["exit"] not in (0, 1):
        out["stderr"] = m["stderr"]
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (Linux ``MemTotal``), None where unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def too_big(name: str, dtype: str | None, memory: int | None) -> str | None:
    """Why the plain load of ``name`` at ``dtype`` cannot be the anchor on a machine of ``memory``
    bytes (its weights alone at that dtype exceed it), else None."""
    size = {"float32": 4, "float64": 8}.get(dtype or "float32", 2)
    need = parameters(name) * size
    if memory is None or need <= memory:
        return None
    return (f"{name}: a plain {dtype or 'float32'} load needs {_gib(need)} for its weights alone, more than "
            f"this machine's {_gib(memory)}; run it with --dtype bfloat16 (both the plain load and the tool)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.1B,0.5B,1.2B", help="comma list of " + ", ".join(SHAPES))
    ap.add_argument("--with-8b", action="store_true", help="also the Llama-3-8B shape (about 16 GB on disk)")
    ap.add_argument("--dtype", default=None, help="the alternative's dtype and the plain load's (default float32)")
    ap.add_argument("--keep", type=Path, default=None, help="write (and reuse) the models here")
    ap.add_argument("--family", default="llama", choices=FAMILIES,
                    help="how the shapes are written: llama (judged by python_reference) or olmo2 (by the "
                    "generic tier's float64_eager)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--tool-args", default="", help="more debug_validate options for the tool, e.g. --tool-args=--no-isolate "
                    "(default: none, its defaults)")
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()] + (["8B"] if args.with_8b else [])
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown sizes {unknown}; known: {', '.join(SHAPES)}")
    memory = machine_memory()
    for name in sizes:
        reason = too_big(name, args.dtype, memory)
        if reason:
            ap.error(reason)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    rows = []
    try:
        for name in sizes:
            rows.append(run_size(name, root, args.dtype, args.tool_args.split(), args.family))
            if not args.json:
                r = rows[-1]
                print(f"{r['size']:>5} {r['family']} {r['parameters'] / 1e9:.2f}B {r['dtype']}{' ' + ' '.join(r['tool_args']) if r['tool_args'] else ''}: plain {r['plain']['seconds']:.1f} s, "
                      f"{_gib(r['plain']['peak_bytes'])} | tool {r['tool']['seconds']:.1f} s, {_gib(r['tool']['peak_bytes'])}"
                      f" (exit {r['tool']['exit']}, {r['verdict']}) | ratios: peak {r['ratio_peak']:.2f}x, "
                      f"time {r['ratio_seconds']:.2f}x | tool {r['tool_bytes_per_parameter']:.2f} bytes/param "
                      f"(plain {r['plain_bytes_per_parameter']:.2f})", flush=True)
                if r["dtype"] != "float32" and too_big(r["size"], "float32", memory):
                    print("   (" + str(too_big(r["size"], "float32", memory)).split("; run")[0]
                          + f": plain and tool both at {r['dtype']})", flush=True)
                print("   tool stages (s):", ", ".join(f"{k} {v}" for k, v in r["tool_stage_s"].items()), flush=True)
                if r["tool_memory"] and r["tool_memory"].get("estimate_bytes"):
                    est = r["tool_memory"]["estimate_bytes"]
                    print(f"   tool's own estimate {_gib(est['total'])} (+ file pages {_gib(est['file_pages'])}), "
                          f"its sampled peak {_gib(r['tool_memory'].get('peak_rss_bytes') or 0)}", flush=True)
                if "stderr" in r["tool"]:
                    print("   tool stderr:", r["tool"]["stderr"].strip().splitlines()[-1:], flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
