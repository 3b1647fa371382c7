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

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PluginCompilationError
from ..jsonio import JsonObject
from ..repro_format import verify
from .evaluate import badness
from .manifest import PluginDefinition
from .worker import Lane, SweepWorker, signal_name

#: The plugin worker's start arguments (:class:`~.subject.PluginSubject`): the definition, the
#: artifact's path, the backend type, recorded model shapes per kernel, the seed, OpInfo samples or not.
_StartArgs = tuple[JsonObject | None, str, str, dict[str, list[dict[str, list[int]]]], int, bool]

__all__ = ["KernelSweep", "SweepReport", "sweep_plugin", "check_in_worker", "signal_name", "DEFAULT_TIMEOUT_S"]

#: Seconds one sample may run before it counts as a hang.
DEFAULT_TIMEOUT_S = 60.0
_START_TIMEOUT_S = 300.0  # starting Python, torch and OpInfo in a fresh process (no plugin code runs yet)


@dataclass
class KernelSweep:
    """One kernel's sweep: every sample's description and result, the counts, the worst sample."""

    kernel: str
    op: str
    samples: list[JsonObject] = field(default_factory=list)  # description + "result"
    worst: JsonObject | None = None
    repro: str | None = None
    #: the repro said ``REPRO: reproduced`` and exited 1 in a fresh process (a crash or hang is not run)
    repro_verified: bool = False
    #: why no repro was written: the worker died or ran past the timeout writing it (its signal named)
    repro_error: str | None = None

    def count(self, status: str) -> int:
        """How many samples have ``status``."""
        return sum(1 for s in self.samples if _status(s) == status)

    @property
    def applicable(self) -> int:
        return len(self.samples) - self.count("skipped")

    @property
    def pass_rate(self) -> float:
        return self.count("pass") / self.applicable if self.applicable else 0.0

    @property
    def passed(self) -> bool:
        return self.applicable > 0 and self.count("pass") == self.applicable

    @property
    def widened_by_noise(self) -> int:
        """Samples judged on a bound the noise rule widened by measured noise
        (:func:`debug_framework.comparison.judge_with_noise`)."""
        return sum(1 for s in self.samples if isinstance(s.get("result"), dict)
                   and isinstance(s["result"].get("noise"), dict) and bool(s["result"]["noise"].get("widened")))

    def by_source(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for s in self.samples:
            row = out.setdefault(str(s["source"]), {"samples": 0, "passed": 0})
            row["samples"] += 1
            row["passed"] += _status(s) == "pass"
        return out

    def to_dict(self, *, with_samples: bool = False) -> JsonObject:
        d: JsonObject = {"kernel": self.kernel, "op": self.op, "samples": len(self.samples), "applicable": self.applicable,
                         "passed_samples": self.count("pass"), "failed": self.count("fail"),
                         "errors": self.count("error"), "crashes": self.count("crash"), "hangs": self.count("hang"),
                         "skipped": self.count("skipped"), "pass_rate": self.pass_rate, "passed": self.passed,
                         "widened_by_noise": self.widened_by_noise,
                         "by_source": dict(self.by_source()), "worst": self.worst, "repro": self.repro,
                         "repro_verified": self.repro_verified, "repro_error": self.repro_error}
        if with_samples:
            d["sample_results"] = list(self.samples)
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

    def to_dict(self, *, with_samples: bool = False) -> JsonObject:
        return {"plugin": self.plugin_id, "passed": self.passed, "seconds": self.seconds,
                "samples": self.total_samples, "worker_restarts": self.worker_restarts,
                "kernels": {n: k.to_dict(with_samples=with_samples) for n, k in self.kernels.items()}}


class _PluginWorker(SweepWorker):
    """One worker process of the plugin's sweep (:class:`~.worker.SweepWorker`, subject ``plugin``):
    it runs in a scratch directory of its own (removed when it stops), so a plugin's relative paths
    never land in the caller's folder; its code still runs with the user's privileges
    (docs/plugins.md). Loading the plugin (its static initialisers) and every later request
    (samples, runs, repros) are bounded by ``timeout_s``, the user's ``--timeout``; only starting
    Python, torch and OpInfo gets longer.

    Raises:
        PluginCompilationError (DF008): the plugin cannot be loaded (the worker's signal named
            where it crashed or hung).
    """

    def __init__(self, args: _StartArgs, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.scratch = tempfile.TemporaryDirectory(prefix="df-plugin-worker-")
        super().__init__("plugin", args, cwd=self.scratch.name, what="the kernel")
        for msg in (None, ("load",)):  # started (Python and torch), then the plugin loaded (bounded by timeout_s)
            reply = self.started(_START_TIMEOUT_S) if msg is None else self.ask(msg, timeout_s)
            if reply is None:
                reason = self.death(timeout_s if msg else _START_TIMEOUT_S)["reason"]
                self.stop()
                raise PluginCompilationError(f"the worker process cannot load the plugin: {reason}",
                                             artifact=args[1],
                                             hint="a static initialiser of the plugin crashed or hung while "
                                                  "loading; raise --timeout if it is only slow")
            if reply[0] != "ok":
                self.stop()
                raise PluginCompilationError(f"the worker process cannot load the plugin: {reply[1]}",
                                             artifact=args[1])

    def stop(self) -> None:
        """Stop the worker and remove its scratch directory."""
        super().stop()
        self.scratch.cleanup()


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
    args: _StartArgs = (defn.to_dict(), str(artifact), defn.backend_type, dict(model_shapes or {}), seed, opinfo)
    start = time.perf_counter()
    lane = Lane(lambda: _PluginWorker(args, timeout_s))
    lane.worker()  # a plugin that cannot be loaded is DF008 before any kernel runs
    report = SweepReport(defn.id, {})
    try:
        for name in names:
            descriptions = _samples(lane, name, timeout_s, defn.id)
            ks = KernelSweep(name, defn.kernel(name).op_name)
            for i, desc in enumerate(descriptions):
                reply = lane.ask(("run", name, i), timeout_s)
                result: JsonObject
                if reply is None:
                    result = dict(lane.died(timeout_s))
                    # the new worker makes this kernel's samples again now, so that work never counts
                    # against the next sample's timeout (and reads as a hang)
                    _samples(lane, name, timeout_s, defn.id)
                elif reply[0] != "ok":
                    raise PluginCompilationError(f"the sweep failed on {name} sample {i}: {reply[1]}", plugin=defn.id)
                else:
                    result = _object(reply[1])
                ks.samples.append({**desc, "index": i, "result": result})
            _pick_worst(ks)
            if repro_dir is not None and ks.worst is not None and _status(ks.worst) != "pass":
                _write_repro(lane, ks, name, Path(repro_dir), timeout_s)
            report.kernels[name] = ks
    finally:
        lane.close()
    report.worker_restarts = lane.restarts
    report.seconds = time.perf_counter() - start
    return report


def _write_repro(lane: Lane, ks: KernelSweep, name: str, repro_dir: Path, timeout_s: float) -> None:
    """The repro of ``ks``'s worst sample, written by the worker and verified once in a fresh process
    (a failure's; a crash or hang is not run); why none was written where the worker could not."""
    assert ks.worst is not None
    # absolute: the worker runs in a scratch directory of its own
    reply = lane.ask(("repro", name, ks.worst["index"], str(repro_dir.resolve())), timeout_s)
    if reply is None:
        ks.repro_error = f"writing the repro stopped the worker process: {lane.died(timeout_s)['reason']}"
    elif reply[0] == "ok":
        ks.repro = str(reply[1])
        # a fresh interpreter: starting it may take longer than the kernel's timeout
        ks.repro_verified = (_status(ks.worst) == "fail"
                             and verify(Path(ks.repro), timeout=_START_TIMEOUT_S + timeout_s).reproduced)
    else:
        ks.repro_error = f"writing the repro failed: {reply[1]}"


def _samples(lane: Lane, name: str, timeout_s: float, plugin_id: str) -> list[JsonObject]:
    """The descriptions of kernel ``name``'s samples, made by ``lane``'s worker within ``timeout_s``.

    Raises:
        PluginCompilationError (DF008): the worker failed, died (its signal named) or ran past ``timeout_s``.
    """
    reply = lane.ask(("samples", name), timeout_s)
    if reply is None:
        raise PluginCompilationError(f"making the samples of {name} stopped the worker process: "
                                     f"{lane.died(timeout_s)['reason']}", plugin=plugin_id,
                                     hint="the plugin's code runs in the worker; raise --timeout if it is only slow")
    if reply[0] != "ok":
        raise PluginCompilationError(f"making the samples of {name} failed: {reply[1]}", plugin=plugin_id)
    return [_object(d) for d in _list(reply[1])]


def check_in_worker(defn: PluginDefinition | None, artifact: str | Path, backend_type: str, *,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> JsonObject:
    """:func:`~debug_framework.plugins.checks.validate_artifact` run in a fresh worker process (the
    caller's process loads nothing; a crash while loading is a DF008, not the caller's death).
    Loading and the checks are each bounded by ``timeout_s`` (the user's ``--timeout``); a worker
    that dies or hangs is DF008 naming the signal (SIGSEGV, SIGKILL by the timeout ...)."""
    worker = _PluginWorker((None if defn is None else defn.to_dict(), str(artifact), backend_type, {}, 0, False),
                           timeout_s)
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
    return _object(reply[1])


def _pick_worst(ks: KernelSweep) -> None:
    """``ks.worst``: its sample that ranks highest by :func:`~.evaluate.badness` (skipped ones aside)."""
    ranked = [s for s in ks.samples if _status(s) != "skipped"]
    if ranked:
        ks.worst = max(ranked, key=lambda s: badness(_object(s["result"])))


def _object(value: object) -> JsonObject:
    """A worker's JSON object answer (a sample's result, its description, the checks' report)."""
    if not isinstance(value, dict):
        raise TypeError(f"the worker answered {type(value).__name__}, not an object")
    return value


def _list(value: object) -> list[object]:
    """A worker's list answer."""
    if not isinstance(value, list):
        raise TypeError(f"the worker answered {type(value).__name__}, not a list")
    return value


def _status(sample: JsonObject) -> object:
    """A recorded sample's status (its result's)."""
    return _object(sample["result"]).get("status")
