"""The conformance sweep of a backend: every selected OpInfo operator, every sample, in worker
processes, stored in the sessions database as it goes.

    settings = SweepSettings(backend="aot_eager", ops=["add", "softmax"], dtypes=("float32",))
    result = run_sweep(settings, database="sessions.db")
    result.passed, [o.op for o in result.failing]

Each worker (``workers`` of them, two by default, one per core) is a fresh Python process
(the op sweep's one worker module, :mod:`debug_framework.plugins.worker`, holding a
:class:`~.subject.BackendSubject`) fed one operator at a time; a sample that kills it is recorded as
``crash`` with its signal or exit status (unless its eager runs alone, in a fresh worker, kill that too: then eager itself crashes
on it and it is skipped, not judged), one that runs past ``timeout_s`` as ``hang``; the worker is
restarted and the sweep goes on. An operator's row is written as soon as it is done; a sweep run again with the same settings
(the same ``sweep_key``) reads back the operators it already has and runs only the others (and
those where the sweep's own code failed, ``counts["sweep_failures"]``). The worst
sample of each failing operator gets a standalone repro (:mod:`.repro`), verified once in a fresh
process (``repro_verified``).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError
from ..jsonio import JsonObject
from ..plugins.worker import InProcess, Lane, SweepWorker
from ..repro_format import verify
from ..storage.database import Database, DatabaseLike, open_database
from .judge import badness
from .results import FAILING, OpResult, SweepResult

__all__ = ["SweepSettings", "run_sweep", "sweep_key", "DEFAULT_TIMEOUT_S"]

#: Seconds one sample (its compile included) may run before it counts as a hang.
DEFAULT_TIMEOUT_S = 120.0
_START_TIMEOUT_S = 300.0  # a fresh process importing torch, OpInfo and the backend
_STATUSES = ("pass", "fail", "error", "crash", "hang", "unsupported", "skipped")


@dataclass
class SweepSettings:
    """What to sweep and how. ``backend`` is a registered ``torch.compile`` backend name, or a label
    when ``backend_file`` gives the backend (its ``backend_attr``, ``backend`` by default), or when
    ``runtime`` names an engine's ONNX runtime (single-op ONNX graphs, :mod:`.runtimes`; the names
    :func:`~.runtime_lookup.runtime_names` lists)."""

    backend: str = "aot_eager"
    backend_file: str | None = None
    backend_attr: str = "backend"
    #: an engine's ONNX runtime instead of a ``torch.compile`` backend (:mod:`.runtime_lookup`)
    runtime: str | None = None
    #: where the samples run (a ``torch.compile`` backend), or the runtime's device (the runtime
    #: maps it to its own: an execution provider, a device name)
    device: str = "cpu"
    dtypes: Sequence[str] = ("float32", "bfloat16", "float16")
    #: judge the backward pass (the gradients of every floating input) instead of the forward
    grad: bool = False
    ops: Sequence[str] | None = None
    fuzz: bool = True
    seed: int = 0
    #: at most this many samples per operator and dtype (OpInfo's first, then the fuzzed ones are cut);
    #: None (the default) runs them all. For quick looks and tests, never for a conformance claim.
    max_samples: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: worker processes (one per core); 0 runs inside the calling process (no crash or hang
    #: isolation: for tests and for debugging a backend)
    workers: int = 2
    repro_dir: Path | str | None = Path("opsweep_repros")
    verify_repros: bool = True
    resume: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    #: stop taking new operators after this many seconds (those under way finish); the operators not
    #: reached are counted in ``SweepResult.left`` and a later run with the same settings resumes them
    time_budget_s: float | None = None

    def identity(self) -> JsonObject:
        """What the sweep's key digests: the backend (the file's content too), device, dtypes, samples."""
        file_digest = None
        if self.backend_file is not None:
            file_digest = hashlib.sha256(Path(self.backend_file).read_bytes()).hexdigest()
        return {"backend": self.backend, "backend_file_sha256": file_digest, "backend_attr": self.backend_attr,
                **({"runtime": self.runtime} if self.runtime is not None else {}),  # older keys unchanged
                "device": self.device, "dtypes": sorted(self.dtypes), "grad": self.grad, "fuzz": self.fuzz,
                "seed": self.seed,
                "max_samples": self.max_samples}


def sweep_key(settings: SweepSettings) -> str:
    """The sweep's key in the database: the same settings resume the same sweep."""
    text = json.dumps(settings.identity(), sort_keys=True)
    return f"{settings.backend}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _start(args: tuple[object, ...], env: dict[str, str], in_process: bool) -> SweepWorker | InProcess:
    """A worker holding the backend (:class:`~.subject.BackendSubject`): a process of its own, or
    the caller's process with ``in_process`` (no crash or hang isolation).

    Raises:
        ConfigurationError (DF005): the backend cannot be loaded.
    """
    if in_process:
        try:
            return InProcess("backend", args)
        except Exception as exc:  # noqa: BLE001 - as the worker process reports it
            raise ConfigurationError(f"cannot load the backend: {type(exc).__name__}: {exc}",
                                     hint="check --compile-backend / --compile-backend-file") from exc
    worker = SweepWorker("backend", args, env={"TORCHINDUCTOR_COMPILE_THREADS": "1", **env}, quiet=True)
    reply = worker.started(_START_TIMEOUT_S)
    if reply is None or reply[0] != "ok":
        why = reply[1] if reply is not None else f"the worker did not start: {worker.death(_START_TIMEOUT_S)['reason']}"
        worker.stop()
        raise ConfigurationError(f"the sweep's worker cannot load the backend: {why}",
                                 hint="check --compile-backend / --compile-backend-file", backend=str(args[0]))
    return worker


class _Lane(Lane):
    """One worker (:class:`~debug_framework.plugins.worker.Lane`) and the operators it sweeps (one
    thread of the parent drives it)."""

    def __init__(self, settings: SweepSettings, threads: int) -> None:
        self.settings = settings
        args = (settings.backend, settings.backend_file, settings.backend_attr, settings.device, settings.fuzz,
                settings.seed, threads, settings.max_samples, settings.grad, settings.runtime)
        super().__init__(lambda: _start(args, settings.extra_env, settings.workers == 0))

    def refresh(self, op: str, dtype: str) -> bool:
        """A fresh worker holding ``op``'s samples in ``dtype``; False where making them kills it."""
        if self.ask(("prepare", op, dtype), _START_TIMEOUT_S) is None:
            self.died(_START_TIMEOUT_S)
            return False
        return True

    def sweep_op(self, op: str) -> OpResult:
        s = self.settings
        start = time.perf_counter()
        samples: list[JsonObject] = []
        skips: list[str] = []
        graphs = sweep_failures = 0
        for dtype in s.dtypes:
            reply = self.ask(("prepare", op, dtype), _START_TIMEOUT_S)
            if reply is None:
                samples.append({"source": "prepare", "label": "making the samples", "dtype": dtype, "index": -1,
                                "result": self.died(_START_TIMEOUT_S)})
                continue
            if reply[0] == "error":
                skips.append(f"{dtype}: not judged, the sweep itself failed: {reply[1]}")
                sweep_failures += 1
                continue
            if "skip" in reply[1]:
                skips.append(f"{dtype}: {reply[1]['skip']}")
                continue
            descriptions = reply[1]["samples"]
            for i, desc in enumerate(descriptions):
                reply = self.ask(("run", i), s.timeout_s)
                if reply is None:
                    result = self.died(s.timeout_s)
                    ready = None  # whether a fresh worker holds the samples (None: none tried since)
                    if result["status"] == "crash":
                        ready = self.refresh(op, dtype)
                        if ready and self.ask(("eager", i), s.timeout_s) is None:
                            # eager dies on it too: PyTorch's own crash, not the backend's
                            self.died(s.timeout_s)
                            ready = None
                            result = {"status": "skipped", "reason": "eager itself crashes on this sample (the "
                                                                     "process dies without the backend): not judged"}
                    if ready is False or (ready is None and i + 1 < len(descriptions) and not self.refresh(op, dtype)):
                        samples.append({**desc, "index": i, "result": result})
                        break
                elif reply[0] == "error":
                    result = {"status": "skipped", "reason": f"not judged, the sweep itself failed: {reply[1]}"}
                    sweep_failures += 1
                else:
                    result = reply[1]
                    graphs = max(graphs, int(result.pop("graphs", 0)))
                samples.append({**desc, "index": i, "result": result})
        out = _aggregate(op, samples, skips, graphs, "(its exported graphs hold no node)" if s.runtime
                         else "(Dynamo ran the operator eagerly)")
        out.counts["sweep_failures"] = sweep_failures  # a resumed sweep runs such an operator again
        if s.repro_dir is not None and out.worst is not None and out.verdict in ("fail", "error"):
            w = out.worst
            reply = self.ask(("repro", op, w["dtype"], w["index"], str(Path(s.repro_dir).resolve()), w["result"]["status"]),
                             _START_TIMEOUT_S)
            if reply is None:
                out.worst["repro_error"] = self.died(_START_TIMEOUT_S)["reason"]
            elif reply[0] == "ok":
                out.repro = reply[1]
                if s.verify_repros:
                    out.repro_verified = verify(Path(reply[1]), timeout=_START_TIMEOUT_S + s.timeout_s).reproduced
            else:  # kept beside the verdict: a repro that could not be written is said, not lost
                out.worst["repro_error"] = str(reply[1])[:300]
        out.seconds = time.perf_counter() - start
        return out


def _aggregate(op: str, samples: list[JsonObject], skips: list[str], graphs: int, no_graph: str) -> OpResult:
    """An operator's verdict from its samples: the worst applicable status decides."""
    counts = {k: 0 for k in _STATUSES}
    for smp in samples:
        counts[smp["result"]["status"]] += 1
    counts["samples"] = len(samples)
    applicable = sum(counts[k] for k in ("pass", *FAILING))
    ranked = [smp for smp in samples if smp["result"]["status"] not in ("skipped", "unsupported")]
    worst = max(ranked, key=lambda smp: badness(smp["result"])) if ranked else None
    allclose = [smp["result"].get("allclose_oracle") for smp in ranked]
    counts["allclose_oracle_fail"] = sum(1 for a in allclose if a is False)
    counts["allclose_eager_fail"] = sum(1 for smp in ranked if smp["result"].get("allclose_eager") is False)
    # passed against PyTorch's decomposition where eager's kernel differs (:func:`.judge.decomposition`)
    counts["by_decomposition"] = sum(1 for smp in ranked if smp["result"].get("definition") == "decomposition")
    # judged on a bound the noise rule widened by measured noise (:func:`..comparison.judge_with_noise`)
    counts["widened_by_noise"] = sum(1 for smp in ranked if (smp["result"].get("noise") or {}).get("widened"))
    if applicable == 0:
        others = [smp["result"] for smp in samples if smp["result"]["status"] == "unsupported"]
        if others:
            return OpResult(op, "unsupported", None, others[0]["reason"], counts)
        reason = "; ".join(skips) or next((smp["result"]["reason"] for smp in samples), None) or "no sample"
        return OpResult(op, "skipped", None, reason, counts)
    if graphs == 0 and counts["pass"] == applicable:  # every sample ran eagerly: nothing was judged
        return OpResult(op, "skipped", None, f"no graph with an operation reached the backend {no_graph}", counts,
                        worst)
    rate = counts["pass"] / applicable
    for verdict in ("crash", "hang", "fail", "error"):
        if counts[verdict]:
            # the worst sample of the verdict's own status (a failing operator's worst sample fails:
            # its reason is the verdict's, its repro reproduces), the most failing by the judge's measure
            worst = max((smp for smp in ranked if smp["result"]["status"] == verdict),
                        key=lambda smp: badness(smp["result"]))
            return OpResult(op, verdict, rate, f"{counts[verdict]} of {applicable} samples: "
                            f"{worst['result'].get('reason')}", counts, worst)
    return OpResult(op, "pass", rate, None, counts, worst)


def run_sweep(settings: SweepSettings, database: DatabaseLike | None = None,
              progress: Callable[[OpResult, int, int], None] | None = None) -> SweepResult:
    """Sweep the selected operators (every OpInfo operator when ``settings.ops`` is empty).

    Raises:
        ConfigurationError (DF005): an unknown dtype, operator or runtime, a backend that cannot be
            loaded, ``--grad`` or a backend file with a runtime.
        BackendInitializationError (DF002): the device does not exist here, or the runtime is not
            installed or has no such device.
    """
    from .devices import check_device
    from .ops import DTYPES, all_ops, select_ops, static_skip
    from .runtime_lookup import find_runtime
    from .runtimes import check_runtime

    bad = [d for d in settings.dtypes if d not in DTYPES]
    if bad or not settings.dtypes:
        raise ConfigurationError(f"unknown dtype {bad[0] if bad else '(none given)'}",
                                 hint=f"use some of {', '.join(DTYPES)}", option="--dtypes")
    if settings.backend_file is not None and not Path(settings.backend_file).is_file():
        raise ConfigurationError(f"backend file {settings.backend_file!r}: no such file", option="--compile-backend-file")
    if settings.runtime is not None:
        find_runtime(settings.runtime)  # DF005 for an unknown name, before the other checks
        if settings.backend_file is not None or settings.grad:
            raise ConfigurationError(f"--runtime {settings.runtime} takes neither --compile-backend-file nor --grad "
                                     "(it runs exported forward graphs)", option="--runtime")
        check_runtime(settings.runtime, settings.device)
    else:
        check_device(settings.device)
    db: Database | None = None if database is None else open_database(database)
    key = sweep_key(settings)
    keys = select_ops(settings.ops)
    start = time.perf_counter()
    results: dict[str, OpResult] = {}
    resumed = 0
    if db is not None:
        db.opsweeps.start(key, settings.backend, settings.device, {**settings.identity(), "ops": list(settings.ops or [])})
        if settings.resume:
            stored = {r["op"]: OpResult.from_row(r) for r in db.opsweeps.results(key)
                      if not (r.get("counts") or {}).get("sweep_failures")}
            for k in keys:
                if k in stored:
                    results[k] = stored[k]
            resumed = len(results)
    todo: queue.Queue[str] = queue.Queue()
    ops = all_ops()
    lock = threading.Lock()

    def record(r: OpResult) -> None:
        with lock:
            results[r.op] = r
            if db is not None:
                db.opsweeps.put(key, r.to_dict())
            if progress is not None:
                progress(r, len(results), len(keys))

    for k in keys:
        if k in results:
            continue
        why = static_skip(ops[k], settings.dtypes, "cpu" if settings.runtime else settings.device)
        if why is not None:
            record(OpResult(k, "skipped", None, why))
        else:
            todo.put(k)
    n_workers = max(1, min(settings.workers, todo.qsize()))
    threads = 0 if settings.workers == 0 else max(1, (os.cpu_count() or 1) // n_workers)
    lanes = [_Lane(settings, threads) for _ in range(n_workers)]
    errors: list[BaseException] = []

    def drive(lane: _Lane) -> None:
        try:
            while not errors:
                if settings.time_budget_s is not None and time.perf_counter() - start >= settings.time_budget_s:
                    return
                try:
                    k = todo.get_nowait()
                except queue.Empty:
                    return
                record(lane.sweep_op(k))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
        finally:
            lane.close()

    if not todo.empty() and settings.workers == 0:
        drive(lanes[0])  # in the caller's thread (a debugger sees the backend's frames)
    elif not todo.empty():
        workers = [threading.Thread(target=drive, args=(lane,), daemon=True) for lane in lanes]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    if errors:
        raise errors[0]
    ordered = [results[k] for k in keys if k in results]
    return SweepResult(key, settings.backend, settings.device, list(settings.dtypes), ordered,
                       time.perf_counter() - start, resumed, sum(lane.restarts for lane in lanes),
                       left=len(keys) - len(ordered))
