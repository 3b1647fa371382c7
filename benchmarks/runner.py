"""The benchmark suite: every workload under every backend, measured, written as JSON, summarised.

    python -m benchmarks.runner --list
    python -m benchmarks.runner --all --warmup 3 --runs 10
    python -m benchmarks.runner --model bert --model resnet --device cpu
    python -m benchmarks.runner --all --quick                 # tiny models (CI)
    inductor-debug report --root benchmarks/results/runs --benchmarks benchmarks/results

Per workload and backend (``eager``, ``inductor``, ``mock_backend``, ``aot_mock_backend``) it records
(docs/benchmarks.md explains each figure):

* cold compile: Dynamo reset, Inductor's in-memory caches cleared, and a new, empty
  ``TORCHINDUCTOR_CACHE_DIR``; the first call is timed (trace + backend compile + one execution) and the
  time spent inside the backend's compiler is timed separately;
* warm compile: Dynamo reset again, same (now populated) cache directory and in-process caches kept;
* latency: ``--warmup`` untimed calls, then ``--runs`` timed calls (mean, std, median, min, max);
* peak memory during the cold compile and during the timed calls (RSS high-water mark on Linux,
  ``max_memory_allocated`` on CUDA);
* graphs, graph breaks and recompilations (``GuardInspector``);
* constraint violations by kind and coverage (mock backends in warn mode), plus the same model under
  the mock's default constraints and under a stricter accelerator profile (``constraint_profiles``);
* KernelDiff of the compiled model against eager (dtype tolerance) and against float64 (ratio rule).

Exit codes: 0 done (a benchmark measures, it does not judge), 2 usage or environment error.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from debug_framework.jsonio import dumps_json
from debug_framework.measure import PeakMemory, TimedBackend, Timer, run_stats

from benchmarks._compile_env import (
    clear_inprocess_compile_caches,
    dynamo_reset,
    inductor_cache_dir,
    lookup_backend,
)
from benchmarks.models.registry import ALIASES, WORKLOADS, Workload, param_count, resolve_names

BENCHMARK_SCHEMA = "debug_module.benchmark/1"  # read by debug_module.reports (inductor-debug report)
SUITE_SCHEMA = "debug_module.benchmark-suite/1"
BACKENDS = ("eager", "inductor", "mock_backend", "aot_mock_backend")
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results"

log = logging.getLogger("benchmarks.runner")


# ---------------------------------------------------------------------------------------------- helpers


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _stats_ms(samples_s: list[float]) -> dict[str, float | int | None]:
    """Latency statistics as the benchmark JSON has them: milliseconds, the count under ``runs``."""
    return run_stats(samples_s, unit="ms", count_key="runs")


def _to_device(inputs: tuple[Any, ...], device: torch.device) -> tuple[Any, ...]:
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)


def _short_path(path: str) -> str:
    """A source file as a reader finds it: inside site-packages from the package on, else repo-relative."""
    p = path.replace("\\", "/")
    if "site-packages/" in p:
        return p.split("site-packages/", 1)[1]
    root = str(Path(__file__).resolve().parents[1]).replace("\\", "/") + "/"
    return p[len(root):] if p.startswith(root) else p


# ---------------------------------------------------------------------------------------------- constraint profiles


def constraint_profiles() -> dict[str, dict[str, Any]]:
    """The constraint sets the case studies compare. ``default``: the mock accelerator as shipped
    (``MockConfig().constraints()``). ``strict``: a matmul-centric accelerator with 16-lane vectors."""
    from debug_module.config import DEFAULT_MOCK_DENYLIST, MockConfig
    from debug_module.constraints import (
        DtypeConstraint,
        LayoutConstraint,
        MemoryConstraint,
        OpDenylistConstraint,
        ShapeConstraint,
    )

    return {
        "default": {
            "description": "MockConfig() defaults: LU/SVD denylisted, alignment 1, no float64/complex, contiguous "
                           "outputs (views exempt), 16 GiB per tensor",
            "constraints": MockConfig().constraints(),
        },
        "strict": {
            "description": "strict accelerator: no convolution kernel (aten.convolution denylisted), innermost dim a "
                           "multiple of 16, dtypes float32/float16/bfloat16/int32/int8/bool only (no float64, no "
                           "int64), every tensor contiguous including views, 16 MiB per tensor",
            "constraints": [
                OpDenylistConstraint((*DEFAULT_MOCK_DENYLIST, "aten.convolution.default")),
                ShapeConstraint(alignment=16, dims="last"),
                DtypeConstraint(["float32", "float16", "bfloat16", "int32", "int8", "bool"]),
                LayoutConstraint(require_contiguous=True, allow_channels_last=False, check_views=True),
                MemoryConstraint(max_tensor_bytes=16 << 20),
            ],
        },
    }


def summarize_reports(reports: list[Any], top: int = 10) -> dict[str, Any]:
    """Violations by kind, aggregated coverage, and the source lines that cause the most violations."""
    violations = [v for r in reports for v in r.violations]
    by_kind = Counter(v.constraint for v in violations)
    nodes = sum(r.coverage.nodes for r in reports)
    supported = sum(r.coverage.supported_nodes for r in reports)
    fallback: Counter[str] = Counter()
    for r in reports:
        fallback.update(r.coverage.fallback_ops)
    sources: Counter[tuple[str, str, str, str]] = Counter()
    examples: dict[tuple[str, str, str, str], str] = {}

    def _source(k: tuple[str, str, str, str], n: int) -> dict[str, Any]:
        return {"constraint": k[0], "where": k[1], "code": k[2], "op": k[3], "count": n, "example": examples[k]}

    for v in violations:
        if v.source is not None:
            key = (v.constraint, f"{_short_path(v.source.file)}:{v.source.line}", v.source.code, v.op or "")
        else:
            key = (v.constraint, "(no source line: graph input or parameter)" if v.op in (None, "placeholder")
                   else "(no source line)", "", v.op or "")
        sources[key] += 1
        examples.setdefault(key, v.message)
    return {
        "graphs": len(reports),
        "violations": len(violations),
        "violations_by_kind": dict(sorted(by_kind.items())),
        "coverage": {
            "nodes": nodes, "supported_nodes": supported,
            "node_share": round(supported / nodes, 6) if nodes else 1.0,
            "partitions": sum(r.coverage.partitions for r in reports),
            "fallback_ops": dict(fallback.most_common()),
        },
        "top_sources": [_source(k, n) for k, n in sources.most_common(top)],
        "top_sources_by_kind": {kind: [_source(k, n) for k, n in sources.most_common() if k[0] == kind][:3]
                                for kind in sorted(by_kind)},
    }


# ---------------------------------------------------------------------------------------------- backends


def make_backend(name: str, runs_dir: Path | None) -> Callable[..., Any]:
    """A fresh backend object (its own records); mock backends in warn mode with default constraints."""
    if name == "inductor":
        return lookup_backend("inductor")
    if name == "mock_backend":
        from debug_module import make_mock_backend

        return make_mock_backend(strict=False)
    if name == "aot_mock_backend":
        from debug_module.aot_backend.mock import aot_mock_backend

        return aot_mock_backend(strict=False, artifact_root=runs_dir)  # type: ignore[arg-type]
    raise ValueError(f"unknown backend {name!r}")


_THREADS: list[int] = []


def pin_threads(n: int | None = None) -> None:
    """Fix torch's intra-op thread count (``n``; default: the count fixed first) before every measured block.

    Other code in the process can change it behind our back: the comparison core's parallel (numba/OpenMP)
    kernels used by KernelDiff leave OpenMP at the machine's core count."""
    if n is not None:
        _THREADS[:] = [n]
    if not _THREADS:
        _THREADS.append(torch.get_num_threads())
    if torch.get_num_threads() != _THREADS[0]:
        torch.set_num_threads(_THREADS[0])


def _prime(backends: list[str], device: torch.device) -> None:
    """One throwaway compile so process-wide one-time costs (lazy imports, C++ compiler probing) are not
    charged to the first workload's cold compile."""
    if "inductor" not in backends and "aot_mock_backend" not in backends:
        return
    with tempfile.TemporaryDirectory(prefix="bench-prime-") as d, inductor_cache_dir(d):
        clear_inprocess_compile_caches()
        fn = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend="inductor")
        with torch.no_grad():
            fn(torch.randn(8, 8, device=device))
        clear_inprocess_compile_caches()


# ---------------------------------------------------------------------------------------------- measuring


class ModelBench:
    def __init__(self, workload: Workload, size: str, device: torch.device, *, warmup: int, runs: int,
                 kd_runs: int, kerneldiff: bool, output_dir: Path, cache_root: Path) -> None:
        self.w = workload
        self.size = size
        self.device = device
        self.warmup = warmup
        self.runs = runs
        self.kd_runs = kd_runs
        self.kerneldiff = kerneldiff
        self.output_dir = output_dir
        self.runs_dir = output_dir / "runs"
        self.cache_root = cache_root
        model, inputs = workload.build(size)
        self.model = model.to(device)
        self.inputs = _to_device(inputs, device)
        self.params = param_count(self.model)
        self.mem = PeakMemory(device)
        self.caches: dict[str, Path] = {}

    def _timed_calls(self, fn: Callable[..., Any]) -> tuple[list[float], dict[str, Any]]:
        pin_threads()
        samples = []
        with torch.no_grad():
            for _ in range(self.warmup):
                fn(*self.inputs)
            with self.mem:
                for _ in range(self.runs):
                    with Timer(self.device) as t:
                        fn(*self.inputs)
                    samples.append(t.seconds)
        return samples, self.mem.result.to_dict()

    def eager(self) -> dict[str, Any]:
        pin_threads()
        with self.mem, Timer(self.device) as t, torch.no_grad():
            self.model(*self.inputs)
        first, first_mem = t.seconds, self.mem.result.to_dict()
        samples, mem = self._timed_calls(self.model)
        return {"backend": "eager", "compile_s": None, "first_call_s": first, "warm_compile_s": None,
                "warm_first_call_s": None, "latency_ms": _stats_ms(samples),
                "graph_count": None, "graph_breaks": None, "recompilations": None, "violations": None,
                "peak_memory_bytes": mem["peak_bytes"], "memory": {"first_call": first_mem, "inference": mem}}

    def _compile_once(self, name: str, cache: Path) -> tuple[Any, TimedBackend, Any, float, dict[str, Any]]:
        from debug_module import GuardInspector

        pin_threads()
        backend = make_backend(name, self.runs_dir)
        timed = TimedBackend(backend)
        with inductor_cache_dir(cache):
            inspector = GuardInspector(self.model, backend=timed, reset=True)
            with self.mem, Timer(self.device) as t, torch.no_grad():
                inspector(*self.inputs)
        return inspector, timed, backend, t.seconds, self.mem.result.to_dict()

    def compiled(self, name: str) -> dict[str, Any]:
        from debug_module.reports import save_guard_report

        cache = Path(tempfile.mkdtemp(prefix=f"{self.w.name}-{name}-", dir=self.cache_root))
        # cold: nothing compiled in this process survives, the on-disk cache directory is new and empty
        clear_inprocess_compile_caches()
        _, cold_timed, cold_backend, cold_first, cold_mem = self._compile_once(name, cache)
        cold_run = getattr(cold_backend, "run_dir", None)
        # warm: Dynamo reset (so it re-traces and the backend compiles again), same cache directory
        inspector, timed, backend, warm_first, warm_mem = self._compile_once(name, cache)
        with inductor_cache_dir(cache):
            samples, mem = self._timed_calls(inspector)
        guards = inspector.report()
        row: dict[str, Any] = {
            "backend": name,
            "compile_s": cold_timed.compile_s, "first_call_s": cold_first,
            "warm_compile_s": timed.compile_s, "warm_first_call_s": warm_first,
            "latency_ms": _stats_ms(samples),
            "graph_count": guards.graph_count, "graph_breaks": guards.graph_break_count,
            "recompilations": len(guards.recompilations),
            "graph_break_reasons": [str(b) for b in guards.graph_breaks],
            "backend_graphs": timed.calls,
            "peak_memory_bytes": mem["peak_bytes"],
            "memory": {"cold_compile": cold_mem, "warm_compile": warm_mem, "inference": mem},
            "violations": None,
        }
        if name in ("mock_backend", "aot_mock_backend"):
            summary = summarize_reports(list(backend.reports))
            row["violations"] = summary["violations"]
            row["constraints"] = summary
        run_dir = getattr(backend, "run_dir", None)
        if run_dir is not None:
            backend.run.set_status(backend.run.manifest["status"], model=f"{self.w.display} ({self.size})",
                                   benchmark=self.w.name)
            save_guard_report(guards, backend.run)
            row["run_dir"] = str(run_dir)
        if cold_run is not None:  # the warm run holds the same graphs and reports; keep one per model
            shutil.rmtree(cold_run, ignore_errors=True)
        self.caches[name] = cache  # KernelDiff compiles again: warm, from this cache (it does not time compiles)
        return row

    def kerneldiff_row(self, name: str) -> dict[str, Any]:
        from debug_module.diff import KernelDiffHarness

        out: dict[str, Any] = {}
        cache = self.caches.get(name) or Path(tempfile.mkdtemp(prefix=f"{self.w.name}-{name}-kd-", dir=self.cache_root))
        for ref in ("eager", "float64"):
            with inductor_cache_dir(cache):
                dynamo_reset()
                backend = make_backend(name, None)
                harness = KernelDiffHarness(self.model, self.inputs,
                                            model_name=f"{self.w.display} ({self.size}) [{name} vs {ref}]",
                                            reference_backend=ref, test_backend=backend, runs=self.kd_runs,
                                            artifact_root=self.runs_dir, minify_on_failure=False)
                rep = harness.compare()
            pin_threads()  # the comparison core's parallel kernels can change the OpenMP thread count
            worst = max(rep.outputs, key=lambda d: d.max_abs_error or 0.0) if rep.outputs else None
            out[ref] = {
                "passed": rep.passed,
                "mode": rep.mode,
                "failed": [d.name for d in rep.failed],
                "max_abs_error": worst.max_abs_error if worst else None,
                "rmse": worst.result.rmse if worst else None,
                "mismatch_percent": worst.result.mismatch_percent if worst else None,
                "ratio": worst.ratio if worst else None,
                "reason": worst.reason if worst else None,
                "report": rep.json_path,
            }
        return out

    def close(self) -> None:
        for cache in self.caches.values():
            shutil.rmtree(cache, ignore_errors=True)
        self.caches.clear()

    def constraint_profiles(self) -> dict[str, Any]:
        from debug_module import make_mock_backend

        out = {}
        for pname, prof in constraint_profiles().items():
            clear_inprocess_compile_caches()
            backend = make_mock_backend(strict=False, constraints=prof["constraints"])
            compiled = torch.compile(self.model, backend=backend)
            with torch.no_grad():
                compiled(*self.inputs)
            out[pname] = {"description": prof["description"],
                          "constraints": [c.describe() for c in prof["constraints"]],
                          **summarize_reports(list(backend.reports), top=12)}
        clear_inprocess_compile_caches()
        return out


def run_workload(w: Workload, size: str, backends: list[str], device: torch.device, *, warmup: int, runs: int,
                 kd_runs: int, kerneldiff: bool, output_dir: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    cache_root = Path(tempfile.mkdtemp(prefix="bench-inductor-cache-"))
    try:
        bench = ModelBench(w, size, device, warmup=warmup, runs=runs, kd_runs=kd_runs, kerneldiff=kerneldiff,
                           output_dir=output_dir, cache_root=cache_root)
        progress(f"{w.name} ({size}): {bench.params:,} parameters")
        rows = []
        for b in backends:
            t0 = time.perf_counter()
            load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
            try:
                row = bench.eager() if b == "eager" else bench.compiled(b)
                if kerneldiff and b != "eager":
                    progress(f"{w.name}: {b} KernelDiff (vs eager, vs float64)")
                    row["kerneldiff_detail"] = bench.kerneldiff_row(b)
                    row["kerneldiff"] = "pass" if all(d["passed"] for d in row["kerneldiff_detail"].values()) else "fail"
                else:
                    row.setdefault("kerneldiff", None)
            except Exception as e:  # a failing backend is a result, recorded with its error
                log.debug("backend %s failed", b, exc_info=True)
                row = {"backend": b, "error": f"{type(e).__name__}: {str(e)[:2000]}",
                       "traceback": traceback.format_exc()[-4000:], "latency_ms": _stats_ms([]),
                       "kerneldiff": None}
            finally:
                bench.close()
            row["wall_s"] = time.perf_counter() - t0
            row["load_average_before"] = load_before  # 1/5/15-minute load: other jobs on a shared machine
            rows.append(row)
            lat = row["latency_ms"]["mean"]
            progress(f"{w.name}: {b} done in {row['wall_s']:.1f}s"
                     + (f", latency {lat:.2f} ms" if lat is not None else f", ERROR {row.get('error')}"))
        progress(f"{w.name}: constraint profiles")
        profiles = bench.constraint_profiles()
        return {
            "schema": BENCHMARK_SCHEMA,
            "name": f"{w.name}-{device.type}" + ("-tiny" if size == "tiny" else ""),
            "model": w.display + (" (tiny)" if size == "tiny" else ""),
            "workload": w.name,
            "family": w.family,
            "description": w.description if size == "full" else "tiny version for quick mode",
            "size": size,
            "parameters": bench.params,
            "created": _now(),
            "device": device.type,
            "torch": torch.__version__,
            "settings": {"warmup": warmup, "runs": runs, "kerneldiff_runs": kd_runs, "threads": _THREADS[0] if _THREADS else torch.get_num_threads(),
                         "grad": False},
            "environment": _environment(),
            "process": os.getpid(),  # with several models, each runs in a process of its own
            "results": rows,
            "constraint_profiles": profiles,
            "notes": ("compile_s/first_call_s: cold (Dynamo reset, Inductor in-memory caches cleared, empty "
                      "TORCHINDUCTOR_CACHE_DIR); warm_*: after another Dynamo reset with the same cache directory. "
                      f"latency_ms after warm-up; peak_memory_bytes: {bench.mem.method} during the timed calls."),
        }
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)


def _environment() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


# ---------------------------------------------------------------------------------------------- output


def _row(result: dict[str, Any], backend: str) -> dict[str, Any] | None:
    return next((r for r in result["results"] if r["backend"] == backend), None)


def _ms(row: dict[str, Any] | None) -> float | None:
    return row["latency_ms"]["mean"] if row else None


def summary_table(results: list[dict[str, Any]]) -> str:
    """The spec README's "BENCHMARK SUMMARY REPORT" (KernelDiff: Inductor vs eager and vs float64)."""
    line = "=" * 80
    out = [line, " " * 20 + "BENCHMARK SUMMARY REPORT", line,
           f"{'Model':<26}{'Eager (ms)':<13}{'Inductor (ms)':<15}{'Speedup':<11}KernelDiff", "-" * 80]
    for res in results:
        e, i = _row(res, "eager"), _row(res, "inductor")
        em, im = _ms(e), _ms(i)
        speed = f"{em / im:.2f}x" if em and im else "n/a"
        kd = (i or {}).get("kerneldiff")
        kd_s = kd.upper() if isinstance(kd, str) else ("ERROR" if i and i.get("error") else "n/a")
        out.append(f"{res['model'][:25]:<26}{(f'{em:.1f}' if em is not None else 'n/a'):<13}"
                   f"{(f'{im:.1f}' if im is not None else 'n/a'):<15}{speed:<11}{kd_s}")
    out.append("-" * 80)
    return "\n".join(out)


def detail_table(results: list[dict[str, Any]]) -> str:
    def f(v: Any, spec: str = ".2f") -> str:
        return "n/a" if v is None else format(v, spec)

    hdr = (f"{'Model':<24}{'Backend':<18}{'cold (s)':>9}{'warm (s)':>9}{'mean ms':>10}{'std':>8}{'runs':>5}"
           f"{'graphs':>7}{'breaks':>7}{'viol.':>7}{'peak MiB':>9}  KD eager/f64")
    out = [hdr, "-" * len(hdr)]
    for res in results:
        if res.get("error"):
            out.append(f"{res['model'][:23]:<24}{'(all)':<18}ERROR {res['error'][:70]}")
        for r in res["results"]:
            if r.get("error"):
                out.append(f"{res['model'][:23]:<24}{r['backend']:<18}ERROR {r['error'][:70]}")
                continue
            kd = r.get("kerneldiff_detail") or {}
            kd_s = "/".join(("pass" if kd[k]["passed"] else "FAIL") for k in ("eager", "float64") if k in kd) or "n/a"
            lat = r["latency_ms"]
            peak = r.get("peak_memory_bytes")
            out.append(f"{res['model'][:23]:<24}{r['backend']:<18}{f(r.get('first_call_s')):>9}"
                       f"{f(r.get('warm_first_call_s')):>9}{f(lat['mean']):>10}{f(lat['std']):>8}{lat['runs']:>5}"
                       f"{f(r.get('graph_count'), 'd'):>7}{f(r.get('graph_breaks'), 'd'):>7}{f(r.get('violations'), 'd'):>7}"
                       f"{f(peak / 2**20 if peak else None, '.0f'):>9}  {kd_s}")
    out.append("cold/warm: first call after a fresh/warm compile cache (trace + compile + one run); "
               "peak: during the timed calls")
    return "\n".join(out)


def write_results(results: list[dict[str, Any]], output_dir: Path, started: str, argv: list[str]) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    for res in results:
        (output_dir / f"{res['name']}.json").write_text(dumps_json(res) + "\n", encoding="utf-8")
    combined = {"schema": SUITE_SCHEMA, "created": _now(), "started": started, "command": argv,
                "torch": torch.__version__, "environment": _environment(),
                "summary_table": summary_table(results), "results": results}
    # in a sub-directory: the report reads every *.json directly in output_dir as one benchmark file
    path = output_dir / "combined" / "suite.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(dumps_json(combined) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.runner", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all", action="store_true", help="every workload")
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="workload or alias (repeatable): " + ", ".join([*WORKLOADS, *ALIASES]))
    p.add_argument("--backend", action="append", default=[], choices=BACKENDS,
                   help="backend (repeatable; default: all four)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls before timing (default 3; quick 1)")
    p.add_argument("--runs", type=int, default=None, help="timed calls (default 10; quick 3)")
    p.add_argument("--kd-runs", type=int, default=2, help="calls per side in KernelDiff (default 2)")
    p.add_argument("--no-kerneldiff", action="store_true", help="skip KernelDiff")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads, set before anything compiles (default: torch's own choice); "
                        "1 gives stable figures on a machine shared with other jobs (docs/benchmarks.md)")
    p.add_argument("--quick", action="store_true", help="tiny versions of the models (CI)")
    p.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT, help=f"default {DEFAULT_OUTPUT}")
    p.add_argument("--list", action="store_true", help="list workloads and backends, then exit")
    p.add_argument("-v", "--verbose", action="store_true", help="show the mock backends' warnings")
    p.add_argument("--same-process", action="store_true",
                   help="run every model in this process (default with several models: a fresh process each, "
                        "so that each model's memory figures are its own)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one model for a parent run
    return p


def _list() -> None:
    print("workloads:")
    for w in WORKLOADS.values():
        print(f"  {w.name:<12} {w.display:<24} {w.description}")
    print("aliases: " + ", ".join(f"{a} -> {'+'.join(v)}" for a, v in ALIASES.items()))
    print("backends: " + ", ".join(BACKENDS))


def _run_child(name: str, args: argparse.Namespace, backends: list[str], warmup: int, runs: int,
               device: torch.device, size: str) -> dict[str, Any]:
    """Benchmark one workload in a fresh ``python -m benchmarks.runner`` process (same settings, same
    output directory) and read back the result it wrote; a child that fails leaves a result saying so."""
    out = args.output_dir.resolve()
    cmd = [sys.executable, "-m", "benchmarks.runner", "--child", "--model", name, "--warmup", str(warmup),
           "--runs", str(runs), "--kd-runs", str(args.kd_runs), "--device", args.device, "--output-dir", str(out)]
    for b in backends:
        cmd += ["--backend", b]
    cmd += ["--threads", str(args.threads)] if args.threads is not None else []
    cmd += ["--quick"] if args.quick else []
    cmd += ["--no-kerneldiff"] if args.no_kerneldiff else []
    cmd += ["-v"] if args.verbose else []
    result_file = out / (f"{name}-{device.type}" + ("-tiny" if size == "tiny" else "") + ".json")
    result_file.unlink(missing_ok=True)  # a stale file must not pass for this run's result
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode == 0 and result_file.is_file():
        return json.loads(result_file.read_text(encoding="utf-8"))
    w = WORKLOADS[name]
    return {"schema": BENCHMARK_SCHEMA, "name": result_file.stem, "model": w.display, "workload": name,
            "family": w.family, "size": size, "created": _now(), "device": device.type, "results": [],
            "error": f"the benchmark process for {name} exited with code {proc.returncode}"
                     + ("" if result_file.is_file() else " without writing its result")}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.list:
        _list()
        return 0
    if not args.all and not args.model:
        print("error: give --all or --model NAME (see --list)", file=sys.stderr)
        return 2
    try:
        names = list(WORKLOADS) if args.all else resolve_names(args.model)
    except KeyError as e:
        print(f"error: unknown model {e.args[0]!r}; known: {', '.join([*WORKLOADS, *ALIASES])}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda but CUDA is not available (torch {torch.__version__}); "
              "use --device cpu or a CUDA build of torch on a machine with a GPU", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    runs = args.runs if args.runs is not None else (3 if args.quick else 10)
    if warmup < 0 or runs < 1 or args.kd_runs < 1:
        print("error: --warmup must be >= 0, --runs and --kd-runs >= 1", file=sys.stderr)
        return 2
    backends = [b for b in BACKENDS if b in args.backend] if args.backend else list(BACKENDS)
    if args.threads is not None:
        if args.threads < 1:
            print("error: --threads must be >= 1", file=sys.stderr)
            return 2
    pin_threads(args.threads)  # None: torch's default, kept for the whole run
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.verbose:
        logging.getLogger("debug_module").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.device(args.device)
    size = "tiny" if args.quick else "full"
    started = _now()

    def progress(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    progress(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, "
             f"warmup {warmup}, runs {runs}, backends {', '.join(backends)}, models {', '.join(names)} ({size})")
    results = []
    if len(names) > 1 and not args.same_process:
        for name in names:
            progress(f"{name}: in a process of its own")
            results.append(_run_child(name, args, backends, warmup, runs, device, size))
            write_results(results, args.output_dir, started, argv)  # keep what is measured if a later model fails
    else:
        _prime(backends, device)
        for name in names:
            res = run_workload(WORKLOADS[name], size, backends, device, warmup=warmup, runs=runs,
                               kd_runs=args.kd_runs, kerneldiff=not args.no_kerneldiff, output_dir=args.output_dir,
                               progress=progress)
            results.append(res)
            write_results(results, args.output_dir, started, argv)  # keep what is measured if a later model fails
    combined = write_results(results, args.output_dir, started, argv)
    if args.child:
        return 0
    print()
    print(summary_table(results))
    print()
    print(detail_table(results))
    print()
    print(f"results: {args.output_dir} (per model) and {combined}")
    print(f"report:  inductor-debug report --root {args.output_dir / 'runs'} --benchmarks {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
