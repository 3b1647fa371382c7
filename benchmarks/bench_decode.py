"""Decode steps (issues 27, 47): what validating one more decode step costs, and the memory of a
session, at 10, 100 and 1000 steps, beside a plain ``transformers`` greedy decode of the same model
in the same run.

* **plain greedy**: the model (a random Llama, ``--size tiny``, ``small`` or ``1b``, a Llama 3.2 1B
  shape, random weights written by the bench) in float32 with eager attention (the code the
  ``pytorch`` alternative runs: the anchor), one prefill then one token at a time through its own
  cache (``past_key_values``), argmax each step: each step timed, so the cost per step between two
  step counts (the steps after the lower up to the higher) is the mean of those steps' times; the
  same with transformers' default attention (``sdpa``) printed beside it. It runs in a fresh
  process just before each session, so that a busy machine slows both alike.
* **the tool**: ``debug_validate --decode-steps N`` on the same model and inputs (reference
  ``float64_eager``, alternative ``pytorch`` float32, calibration at float32, no isolation): one
  whole session per step count, each in a fresh subprocess (after a 1-step warm-up session there)
  so that its peak memory is its own. The decode stage times each validated step (its two passes,
  the calibration's prefill where its noise is measured, and its judgement: ``decode["step_wall_s"]``,
  and the process's CPU time in it, ``decode["step_cpu_s"]``); their mean over the steps after the
  lower count up to the higher is the tool's cost of one more decode step there, printed beside the
  plain step's over the same steps (wall time, then CPU time: on a loaded machine the wall figures
  follow the load, the CPU ones much less) and as their ratio; the peak resident memory of each
  session's process and its growth during the session, beside plain greedy's process. Where the
  reference's decode runs ahead in a process of its own (two CPUs or more: docs/validation.md,
  "Decode steps"), that process's peak memory and CPU time per step are printed too, and the
  CPU time per step of the whole session counts both processes. Where the reference computed
  several steps a pass (docs/validation.md, "Decode steps"), how many steps in how many passes.
  From the second count on, one more step of the *whole* session (its store stage and result
  included: the session at this count minus the one before, over the steps between), beside plain
  greedy's step: what a user timing whole sessions sees. Last, the last count's cost per step
  beside the first's, with plain greedy's own growth (attention over a longer cache) and what
  validating adds to a step (the tool's step less the plain one) at each; with three counts or
  more, the same from the second count on (the first count's steps hold the session's start).

Nothing is asserted about time or memory: the figures are printed (docs/benchmarks.md, "Decode steps").

    python -m benchmarks.bench_decode [--size tiny|small|1b] [--steps 10 100 1000] [--quick | --issue]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: random Llamas: tiny (the tests' size), small (a few million parameters) and 1b (Llama 3.2 1B's shape)
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, max_position_embeddings=2048),
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=2048),
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048),
}


def build(size: str, directory: Path, seed: int = 0) -> Path:
    """A random Llama of ``size`` saved under ``directory`` (safetensors, no tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    net = LlamaForCausalLM(LlamaConfig(**SIZES[size], rms_norm_eps=1e-6))
    net.save_pretrained(directory)
    return directory


def _inputs(vocab: int, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen)


def plain_greedy(path: Path, batch: int, length: int, steps: int,
                 clock: Callable[[], float] = time.perf_counter, attention: str = "eager") -> list[float]:
    """The seconds of each of ``steps`` greedy decode steps through the model's own cache, float32
    ``transformers`` with ``attention`` (``"eager"``: the code the ``pytorch`` alternative runs;
    ``"sdpa"``: transformers' default), after a 2-step warm-up, by ``clock`` (wall time, or this
    process's CPU time)."""
    import inspect

    import torch
    from transformers import LlamaForCausalLM

    net = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attention).eval()
    cache_arg = "cache" if "cache" in inspect.signature(net.forward).parameters else "past_key_values"

    def cache_of(out: object) -> object:
        return getattr(out, "cache", None) or getattr(out, "past_key_values")
    ids = _inputs(net.config.vocab_size, batch, length)
    mask = torch.ones_like(ids)
    times: list[float] = []
    with torch.inference_mode():
        for n in (2, steps):  # the first round warms up
            out = net(input_ids=ids, attention_mask=mask, use_cache=True)
            cache, logits, m = cache_of(out), out.logits, mask
            times = []
            for _ in range(n):
                tok = logits[:, -1].argmax(-1, keepdim=True)
                m = torch.cat([m, torch.ones_like(tok)], dim=1)
                start = clock()
                out = net(input_ids=tok, attention_mask=m, use_cache=True, **{cache_arg: cache})
                times.append(clock() - start)
                cache, logits = cache_of(out), out.logits
    return times


def _rss_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def one_session(path: Path, root: Path, batch: int, length: int, steps: int) -> dict[str, float | list[float]]:
    """One ``--decode-steps steps`` session (after a 1-step warm-up one in this process, and a 1-step
    one timed): its decode stage's and whole seconds, each validated step's seconds, the CPU time of
    one more step (the difference of the two sessions' CPU time over the difference in steps), the
    process's peak resident memory and its growth during the session.
    Plain greedy decoding of the same steps runs in a process of its own just before (:func:`tool`),
    so that both see the machine as it is then."""
    import torch

    from debug_framework.services.validation_engine import ValidationEngine

    torch.set_num_threads(1)
    engine = ValidationEngine(database_path=root / f"decode_{steps}.db")
    config = {"model_tier": "generic", "isolate": False, "precision_diagnosis": False, "input_shape": [batch, length]}
    engine.run(engine.create_session(path, {**config, "decode_steps": 1}, "float64_eager", "pytorch"))  # warm-up
    cpu = time.process_time()
    one = engine.run(engine.create_session(path, {**config, "decode_steps": 1}, "float64_eager", "pytorch"))
    cpu_one = time.process_time() - cpu
    before = _rss_bytes()
    start, cpu = time.perf_counter(), time.process_time()
    result = engine.run(engine.create_session(path, {**config, "decode_steps": steps}, "float64_eager", "pytorch"))
    elapsed, cpu_all = time.perf_counter() - start, time.process_time() - cpu
    del one
    if not result.passed:
        raise SystemExit(f"a correct pair failed at {steps} decode steps: {result.first_divergence}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    info = result.decoded.info if result.decoded is not None else {}
    child = info.get("reference_process") or {}  # the reference's decode in a process of its own
    child_peak = float(child.get("peak_rss_bytes") or 0) if child.get("ahead") else 0.0  # type: ignore[union-attr, arg-type]
    walls, cpus = info.get("step_wall_s") or [], info.get("step_cpu_s") or []
    chunks = info.get("reference_chunks") or {}  # the reference's passes of several steps
    return {"chunk_passes": float(chunks.get("passes", 0)), "chunk_steps": float(chunks.get("steps", 0)),  # type: ignore[union-attr]
            "chunk_computed": float(chunks.get("computed", 0)),  # type: ignore[union-attr]
            "stage_s": float(result.performance["decode_s"]), "session_s": elapsed, "peak_bytes": float(peak),
            "growth_bytes": float(max(0, peak - before)), "step_s": [float(t) for t in walls],  # type: ignore[arg-type, union-attr]
            "step_cpu_s": [float(t) for t in cpus],  # type: ignore[arg-type, union-attr]
            "cpu_per_step_s": (cpu_all - cpu_one) / max(1, steps - 1), "child_peak_bytes": child_peak,
            "child_cpu_s": _children_cpu_s()}


def _children_cpu_s() -> float:
    """The CPU seconds of this process's ended children (the reference's decode processes)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def plain_session(path: Path, batch: int, length: int, steps: int) -> dict[str, float | list[float]]:
    """:func:`plain_greedy` over ``steps`` steps (one thread) and this process's peak memory."""
    import torch

    torch.set_num_threads(1)
    times = plain_greedy(path, batch, length, steps)
    cpu = plain_greedy(path, batch, length, steps, clock=time.process_time)
    sdpa = plain_greedy(path, batch, length, steps, attention="sdpa")
    return {"step_s": times, "cpu_step_s": cpu, "sdpa_step_s": sdpa,
            "peak_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}


def _fresh(call: str, what: str) -> dict[str, float | list[float]]:
    """``call`` (an expression of this module's functions) in a fresh Python process: its JSON result."""
    code = f"import json; from pathlib import Path; from benchmarks.bench_decode import *; print(json.dumps({call}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                                    os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{what} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def tool(path: Path, root: Path, batch: int, length: int, steps: int) -> dict[str, float | list[float]]:
    """:func:`one_session` in a fresh Python process (its peak memory its own), and plain greedy
    decoding of the same steps in another just before (``plain_step_s``, ``plain_peak_bytes``)."""
    plain = _fresh(f"plain_session(Path({str(path)!r}), {batch}, {length}, {steps})", f"plain greedy of {steps} steps")
    run = _fresh(f"one_session(Path({str(path)!r}), Path({str(root)!r}), {batch}, {length}, {steps})",
                 f"the {steps}-step session")
    return {**run, "plain_step_s": plain["step_s"], "plain_cpu_step_s": plain["cpu_step_s"],
            "plain_sdpa_step_s": plain["sdpa_step_s"],
            "plain_peak_bytes": plain["peak_bytes"]}


def measure(size: str, counts: list[int], batch: int, length: int) -> None:
    """Print, for each step count, the tool's cost of one more decode step beside plain greedy's over
    the same steps, and the peak memory of both (see the module)."""
    params = SIZES[size]
    print(f"random llama '{size}' ({params['num_hidden_layers']} layers, hidden {params['hidden_size']}, vocab "
          f"{params['vocab_size']}), batch {batch}, prompt {length}, 1 thread, one session per count", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = build(size, root / "llama")
        low = 1
        # (steps, ms per step, ratio to plain, peak bytes, the child's, plain greedy's ms per step)
        seen: list[tuple[int, float, float, float, float, float]] = []
        session_before = 0.0  # the session at the count before (0: none yet)
        for n in counts:  # each count printed as soon as its session is done
            run = tool(path, root, batch, length, n)
            plain, steps = run["plain_step_s"], run["step_s"]
            assert isinstance(plain, list) and isinstance(steps, list)
            mine = sum(steps[low:n]) / (n - low)  # the same steps of both, each timed where it ran
            base = sum(plain[low:n]) / (n - low)
            sdpa = run["plain_sdpa_step_s"]
            assert isinstance(sdpa, list)
            base_sdpa = sum(sdpa[low:n]) / (n - low)
            plain_cpu, step_cpu = run["plain_cpu_step_s"], run["step_cpu_s"]
            assert isinstance(plain_cpu, list) and isinstance(step_cpu, list)
            child_cpu = float(run["child_cpu_s"]) / (n - 1)  # type: ignore[arg-type]
            cpu, cpu_base = float(run["cpu_per_step_s"]) + child_cpu, sum(plain_cpu[1:n]) / (n - 1)  # type: ignore[arg-type]
            child_peak = float(run["child_peak_bytes"])  # type: ignore[arg-type]
            child = (f"; the reference's own process: peak {child_peak / 2**20:.0f} MiB, CPU {child_cpu * 1e3:.2f} ms "
                     "per step" if child_peak else "; the reference in this process")
            mine_cpu, base_cpu = sum(step_cpu[low:n]) / (n - low), sum(plain_cpu[low:n]) / (n - low)
            if run["chunk_passes"]:
                child += (f"; the reference computed {run['chunk_steps']:.0f} steps in {run['chunk_passes']:.0f} passes of "
                          f"several ({run['chunk_computed']:.0f} computed)")
            whole = float(run["session_s"])  # type: ignore[arg-type]
            if session_before:  # what a user timing whole sessions sees: its store and its report included
                child += (f"; whole session: one more step {(whole - session_before) / (n - low) * 1e3:.2f} ms, "
                          f"{(whole - session_before) / (n - low) / base:.1f}x plain greedy's")
            session_before = whole
            print(f"steps {low + 1}..{n}: the tool {mine * 1e3:.2f} ms per decode step, plain greedy "
                  f"{base * 1e3:.2f} ms: {mine / base:.1f}x (with transformers' default sdpa attention "
                  f"{base_sdpa * 1e3:.2f} ms: {mine / base_sdpa:.1f}x); CPU time {mine_cpu * 1e3:.2f} ms against {base_cpu * 1e3:.2f} ms: "
                  f"{mine_cpu / base_cpu:.1f}x (CPU time per step of the whole session, steps 2..{n}: {cpu * 1e3:.2f} ms against "
                  f"{cpu_base * 1e3:.2f} ms, {cpu / cpu_base:.1f}x) | session at {n}: decode stage {run['stage_s']:.2f} s, "
                  f"whole {run['session_s']:.2f} s, peak memory {float(run['peak_bytes']) / 2**20:.0f} MiB "  # type: ignore[arg-type]
                  f"(+{float(run['growth_bytes']) / 2**20:.0f} MiB during the session; plain greedy's process "  # type: ignore[arg-type]
                  f"{float(run['plain_peak_bytes']) / 2**20:.0f} MiB{child})", flush=True)  # type: ignore[arg-type]
            seen.append((n, mine, mine / base, float(run["peak_bytes"]), child_peak, base))  # type: ignore[arg-type]
            low = n
        if len(seen) > 1:  # the issue's figures: the last count's beside the first's
            (n0, t0, r0, m0, c0, p0), (n1, t1, r1, m1, c1, p1) = seen[0], seen[-1]
            child = f"; the reference's process {c1 / c0:.2f}x ({c1 / 2**20:.0f} MiB beside {c0 / 2**20:.0f} MiB)" \
                if c0 and c1 else ""
            # what validating adds to a step, the plain step's own growth with the cache taken out
            own = _added(t1, p1, t0, p0) if t0 > p0 else "n/a (not above the plain step)"
            # the same past the first count, whose steps hold the session's start (the child's, its first pass)
            later = ""
            if len(seen) > 2 and seen[1][1] > seen[1][5]:
                n_mid, t_mid, p_mid = seen[1][0], seen[1][1], seen[1][5]
                later = (f"; from the second count: steps {n0 + 1}..{n_mid} beside the last, cost per step "
                         f"{t1 / t_mid:.2f}x, plain greedy's own {p1 / p_mid:.2f}x, what validating adds "
                         f"{_added(t1, p1, t_mid, p_mid)}")
            print(f"{n1} steps beside {n0}: cost per step {t1 / t0:.2f}x (ratio to plain greedy {r1:.1f}x beside "
                  f"{r0:.1f}x; plain greedy's own {p1 / p0:.2f}x; what validating adds to a step {own}{later}), peak "
                  f"memory {m1 / m0:.2f}x ({m1 / 2**20:.0f} MiB beside {m0 / 2**20:.0f} MiB{child})", flush=True)


def _added(tool: float, plain: float, tool_before: float, plain_before: float) -> str:
    """What validating adds to a step (the tool's step less the plain one) beside what it added
    before: their ratio, then both in milliseconds."""
    return (f"{(tool - plain) / (tool_before - plain_before):.2f}x ({(tool - plain) * 1e3:.2f} ms beside "
            f"{(tool_before - plain_before) * 1e3:.2f} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 100, 1000], help="decode step counts (ascending)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 3 and 10 steps")
    parser.add_argument("--issue", action="store_true", help="issue 47's figures: the 'small' model at 10, 100 and "
                        "1000 steps, then the 1b shape at 64")
    args = parser.parse_args(argv)
    runs = [(args.size, sorted(set(args.steps)))]
    if args.quick:
        runs = [("tiny", [3, 10])]
    elif args.issue:
        runs = [("small", [10, 100, 1000]), ("1b", [64])]
    if any(counts[0] < 2 for _, counts in runs):
        parser.error("need --steps of 2 or more (a 1-step session is the base)")
    for size, counts in runs:
        measure(size, counts, args.batch, args.length)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
