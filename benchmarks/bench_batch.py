"""Batch throughput: items per minute for N tiny models, local processes against Ray, in one run.

Models: ``--models`` (default 6) random 2-layer Llama decoders (hidden 64), saved with
``save_pretrained`` into a temporary directory; each item is a full session (reference
``python_reference``, alternative ``pytorch``, float32, no isolation). Each executor runs the same
list as a fresh job on a fresh SQLite database, ``--workers`` items at a time (default 2):

* ``local processes``: the anchor (``parallel_execution``, spawned worker processes);
* ``ray``: ``executor="ray"`` on a local Ray instance started for the job (``ray.init`` with
  ``--workers`` CPUs), the driver ingesting each worker's rows and tensors.

Wall time is measured around ``execute_job(job)`` and includes each executor's start-up (spawning
processes, starting Ray and its workers, imports): the honest figure for a batch of this size. The
figures are printed side by side; nothing is asserted. Everything is written under a temporary
directory, removed at the end.

    python -m benchmarks.bench_batch [--models 6] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _tiny_llama(directory: Path, seed: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(str(directory))
    return directory


def _run(name: str, models: list[str], root: Path, workers: int, extra: dict) -> tuple[float, int]:
    """Seconds for one fresh job over ``models`` and how many items ended done."""
    from debug_framework.models.batch_validation_job import BatchValidationJob
    from debug_framework.services.executors import execute_job

    config = {"database_path": str(root / f"{name}.db"), "alternative_backend": "pytorch", "isolate": False,
              "parallel_execution": True, "max_concurrent_jobs": workers, **extra}
    start = time.perf_counter()
    results = execute_job(BatchValidationJob(f"bench-{name}", models, config))
    return time.perf_counter() - start, sum(r["status"] == "done" for r in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    try:
        models = [str(_tiny_llama(root / f"m{i}", i)) for i in range(args.models)]
        rows = [("local processes (anchor)", *_run("local", models, root, args.workers, {}))]
        try:
            import ray
        except ImportError:
            print("ray is not installed: only the anchor was measured (pip install '.[ray]')")
        else:
            start = time.perf_counter()  # Ray's start-up is part of its figure
            ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
            try:
                up = time.perf_counter() - start
                seconds, done = _run("ray", models, root, args.workers, {"executor": "ray"})
                rows.append(("ray (local instance)", up + seconds, done))
            finally:
                ray.shutdown()
        anchor = rows[0][1]
        print(f"{args.models} tiny models, {args.workers} at a time, wall time including start-up")
        print(f"{'executor':28} {'seconds':>8} {'items/min':>10} {'done':>5} {'vs anchor':>10}")
        for label, seconds, done in rows:
            print(f"{label:28} {seconds:8.2f} {60.0 * done / seconds:10.1f} {done:5d} {seconds / anchor:9.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
