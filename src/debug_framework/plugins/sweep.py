"""The op-by-op sweep: every kernel of a plugin over its samples, in a worker process.

    report = sweep_plugin(defn, build.artifact, repro_dir=Path("repros"))
    report.passed, report.kernels["rms_norm"].pass_rate, report.kernels["rms_norm"].worst

Each sample is judged by :func:`~debug_framework.plugins.evaluate.evaluate_sample`. A sample that
kills the worker (a segfault, an abort) is recorded as ``crash`` with its exit status, one that runs
past ``timeout_s`` as ``hang``; the worker is restarted and the sweep goes on with the next sample.
A kernel passes when every sample that applies passes (BackendBench's rule). The worst sample of
each failing kernel gets a standalone repro when ``repro_dir`` is given (:mod:`.repro`, the one repro
format); a failing sample's repro is verified once in a fresh process (``repro_verified``).
"""

from __future__ import annotations

import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PluginCompilationError
from ..repro_format import verify
from .evaluate import badness
from .manifest import PluginDefinition
from .pipeworker import PipeWorker

__all__ = ["KernelSweep", "SweepReport", "sweep_plugin", "check_in_worker", "signal_name", "DEFAULT_TIMEOUT_S"]

#: Seconds one sample may run before it counts as a hang.
DEFAULT_TIMEOUT_S = 60.0
_START_TIMEOUT_S = 300.0  # starting Python, torch and OpInfo in a fresh process (no plugin code runs yet)


@dataclass
class KernelSweep:
    """One kernel's sweep: every sample's description and result, the counts, the worst sample."""

    kernel: str
    op: str
    samples: list[dict[str, Any]] = field(default_factory=list)  # description + "result"
    worst: dict[str, Any] | None = None
    repro: str | None = None
    #: the repro said ``REPRO: reproduced`` and exited 1 in a fresh process (a crash or hang is not run)
    repro_verified: bool = False
    #: why no repro was written: the worker died or ran past the timeout writing it (its signal named)
    repro_error: str | None = None

    def count(self, status: str) -> int:
        return sum(1 for s in self.samples if s["result"]["status"] == status)

    @property
    def applicable(self) -> int:
        return len(self.samples) - self.count("skipped")

    @property
    def pass_rate(self) -> float:
        return self.count("pass") / self.applicable if self.applicable else 0.0

    @property
    def passed(self) -> bool:
        return self.applicable > 0 and self.count("pass") == self.applicable

    def by_source(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for s in self.samples:
            row = out.setdefault(s["source"], {"samples": 0, "passed": 0})
            row["samples"] += 1
            row["passed"] += s["result"]["status"] == "pass"
        return out

    def to_dict(self, *, with_samples: bool = False) -> dict[str, Any]:
        d = {"kernel": self.kernel, "op": self.op, "samples": len(self.samples), "applicable": self.applicable,
             "passed_samples": self.count("pass"), "failed": self.count("fail"), "errors": self.count("error"),
             "crashes": self.count("crash"), "hangs": self.count("hang"), "skipped": self.count("skipped"),
             "pass_rate": self.pass_rate, "passed": self.passed, "by_source": self.by_source(),
             "worst": self.worst, "repro": self.repro, "repro_verified": self.repro_verified,
             "repro_error": self.repro_error}
        if with_samples:
            d["sample_results"] = self.samples
        return d


@dataclass
class SweepReport:
    """The sweep of a plugin: per kernel, and how long it took."""

    plugin_id: str
    kernels: dict[str, KernelSweep]
    seconds: float = 0.0
    worker_restarts: int = 0

    @property
    def passed(self) -> bool:
        return all(k.passed for k in self.kernels.values())

    @property
    def total_samples(self) -> int:
        return sum(len(k.samples) for k in self.kernels.values())

    def to_dict(self, *, with_samples: bool = False) -> dict[str, Any]:
        return {"plugin": self.plugin_id, "passed": self.passed, "seconds": self.seconds,
                "samples": self.total_samples, "worker_restarts": self.worker_restarts,
                "kernels": {n: k.to_dict(with_samples=with_samples) for n, k in self.kernels.items()}}


class _Worker(PipeWorker):
    """One worker process (``python -m debug_framework.plugins.worker``) and its two pipes
    (:class:`~.pipeworker.PipeWorker`); restarted after a crash or a hang. It runs in a scratch
    directory of its own (removed when it stops), so a plugin's relative paths never land in the
    caller's folder; its code still runs with the user's privileges (docs/plugins.md). Loading the
    plugin (its static initialisers) and every later request (samples, runs, repros) are bounded by
    ``timeout_s``, the user's ``--timeout``; only starting Python, torch and OpInfo gets longer."""

    def __init__(self, args: tuple[Any, ...], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.scratch = tempfile.TemporaryDirectory(prefix="df-plugin-worker-")
        super().__init__("debug_framework.plugins.worker", args, cwd=self.scratch.name)
        for msg in (None, ("load",)):  # started (Python and torch), then the plugin loaded (bounded by timeout_s)
            reply = self._reply(_START_TIMEOUT_S) if msg is None else self.ask(msg, timeout_s)
            if reply is not None and reply[0] == "died" and msg is None:
                self.wait_dying()
            if reply is None or reply[0] == "died":
                reason = self.death(timeout_s if msg else _START_TIMEOUT_S)["reason"]
                self.stop()
                raise PluginCompilationError(f"the worker process cannot load the plugin: {reason}",
                                             artifact=str(args[1]),
                                             hint="a static initialiser of the plugin crashed or hung while "
                                                  "loading; raise --timeout if it is only slow")
            if reply[0] != "ok":
                self.stop()
                raise PluginCompilationError(f"the worker process cannot load the plugin: {reply[1]}",
                                             artifact=str(args[1]))

    def stop(self) -> None:
        super().stop()
        self.scratch.cleanup()

    def death(self, timeout: float) -> dict[str, Any]:
        """What happened to a worker that did not answer: a crash (its exit status) or a hang."""
        code = self.proc.poll()
        if code is None or self.killed:
            return {"status": "hang", "reason": f"no answer within {timeout:g} s (the worker was killed with SIGKILL)",
                    "signal": "SIGKILL"}
        if code < 0:
            name = signal_name(-code)
            return {"status": "crash", "reason": f"the kernel crashed the worker process ({name})", "signal": name}
        return {"status": "crash", "reason": f"the kernel crashed the worker process (exit status {code})"}


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11 ...; ``signal 99`` for a number without a name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def sweep_plugin(defn: PluginDefinition, artifact: str | Path, *, kernels: list[str] | None = None,
                 model_shapes: dict[str, list[dict[str, list[int]]]] | None = None, seed: int = 0,
                 timeout_s: float = DEFAULT_TIMEOUT_S, repro_dir: Path | None = None,
                 opinfo: bool = True) -> SweepReport:
    """Run every sample of the plugin's kernels (or of ``kernels``) in a worker process.

    Raises:
        PluginCompilationError (DF008): the plugin cannot be loaded; an unknown kernel name.
    """
    names = kernels or [k.name for k in defn.kernels]
    for n in names:
        defn.kernel(n)
    args = (defn.to_dict(), str(artifact), defn.backend_type, dict(model_shapes or {}), seed, opinfo)
    start = time.perf_counter()
    worker: _Worker | None = _Worker(args, timeout_s)
    report = SweepReport(defn.id, {})
    try:
        for name in names:
            if worker is None:  # stopped writing the last kernel's repro
                worker = _Worker(args, timeout_s)
                report.worker_restarts += 1
            descriptions = _samples(worker, name, timeout_s, defn.id)
            ks = KernelSweep(name, defn.kernel(name).op_name)
            for i, desc in enumerate(descriptions):
                reply = worker.ask(("run", name, i), timeout_s)
                if reply is None:
                    result = worker.death(timeout_s)
                    worker = _Worker(args, timeout_s)
                    report.worker_restarts += 1
                    # the new worker makes this kernel's samples again now, so that work never counts
                    # against the next sample's timeout (and reads as a hang)
                    _samples(worker, name, timeout_s, defn.id)
                elif reply[0] != "ok":
                    raise PluginCompilationError(f"the sweep failed on {name} sample {i}: {reply[1]}", plugin=defn.id)
                else:
                    result = reply[1]
                ks.samples.append({**desc, "index": i, "result": result})
            _pick_worst(ks)
            if repro_dir is not None and ks.worst is not None and ks.worst["result"]["status"] != "pass":
                # absolute: the worker runs in a scratch directory of its own
                reply = worker.ask(("repro", name, ks.worst["index"], str(Path(repro_dir).resolve())), timeout_s)
                if reply is not None and reply[0] == "ok":
                    ks.repro = reply[1]
                    # a fresh interpreter: starting it may take longer than the kernel's timeout
                    ks.repro_verified = (ks.worst["result"]["status"] == "fail"
                                         and verify(Path(reply[1]), timeout=_START_TIMEOUT_S + timeout_s).reproduced)
                elif reply is None:
                    ks.repro_error = f"writing the repro stopped the worker process: {worker.death(timeout_s)['reason']}"
                    worker = None  # restarted only if another kernel follows
                else:
                    ks.repro_error = f"writing the repro failed: {reply[1]}"
            report.kernels[name] = ks
    finally:
        if worker is not None:
            worker.stop()
    report.seconds = time.perf_counter() - start
    return report


def _samples(worker: _Worker, name: str, timeout_s: float, plugin_id: str) -> list[dict[str, Any]]:
    """The descriptions of kernel ``name``'s samples, made by ``worker`` within ``timeout_s``.

    Raises:
        PluginCompilationError (DF008): the worker failed, died (its signal named) or ran past ``timeout_s``.
    """
    reply = worker.ask(("samples", name), timeout_s)
    if reply is None:
        raise PluginCompilationError(f"making the samples of {name} stopped the worker process: "
                                     f"{worker.death(timeout_s)['reason']}", plugin=plugin_id,
                                     hint="the plugin's code runs in the worker; raise --timeout if it is only slow")
    if reply[0] != "ok":
        raise PluginCompilationError(f"making the samples of {name} failed: {reply[1]}", plugin=plugin_id)
    return reply[1]


def check_in_worker(defn: PluginDefinition | None, artifact: str | Path, backend_type: str, *,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """:func:`~debug_framework.plugins.checks.validate_artifact` run in a fresh worker process (the
    caller's process loads nothing; a crash while loading is a DF008, not the caller's death).
    Loading and the checks are each bounded by ``timeout_s`` (the user's ``--timeout``); a worker
    that dies or hangs is DF008 naming the signal (SIGSEGV, SIGKILL by the timeout ...)."""
    worker = _Worker((None if defn is None else defn.to_dict(), str(artifact), backend_type, {}, 0, False), timeout_s)
    try:
        reply = worker.ask(("checks",), timeout_s)
        death = worker.death(timeout_s) if reply is None else None
    finally:
        worker.stop()
    if death is not None:
        raise PluginCompilationError(f"checking the artifact stopped the worker process: {death['reason']}",
                                     artifact=str(artifact),
                                     hint="a kernel or a static initialiser of the plugin crashed or hung; "
                                          "raise --timeout if it is only slow")
    if reply[0] != "ok":
        raise PluginCompilationError(f"checking the artifact failed: {reply[1]}", artifact=str(artifact))
    return reply[1]


def _pick_worst(ks: KernelSweep) -> None:
    ranked = [s for s in ks.samples if s["result"]["status"] != "skipped"]
    if ranked:
        ks.worst = max(ranked, key=lambda s: badness(s["result"]))
