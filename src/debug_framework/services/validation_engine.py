"""The validation engine: run two backends on the same saved inputs, compare every checkpoint,
name the first divergence, isolate the layer that introduces error, and store it all.

    engine = ValidationEngine("/tmp/debug.db")
    sid = engine.create_session("path/to/model", {"isolate": True}, "python_reference", "pytorch")
    result = engine.execute_validation(sid)          # JSON-ready dict (ValidationResult.to_dict())
    result["verdict"], result["first_divergence"]

What one validation does (:meth:`ValidationEngine.run`):

1. load the model (its weights digest must still match the session's) and the saved inputs;
2. prepare and run the reference and the alternative backend (wall time, per-layer time where
   measurable, peak memory when ``profile_memory_usage``);
3. compare every enabled checkpoint with :func:`debug_framework.comparison.compare`
   (``check_dtype=False``; tolerance from ``precision_thresholds``, per checkpoint overridable);
   the rows are written to the database right away, in model order;
4. isolation (where both backends have ``run_layer``): replay each layer of the alternative on the
   *reference's* input to that layer; the error of that replay is what the layer introduces, the
   error at the layer's input in the full run is what it carries in;
5. oracle mode: run ``python_reference`` in float64 too and judge each checkpoint by the ratio
   rule ``err(alt, oracle) <= m * err(ref, oracle) + floor``;
6. noise floor: run each backend a second time and report run-to-run differences separately;
7. the verdict (``passed``/``failed``) and summary go to the session; a failure to execute sets
   the session to ``error`` with the message and keeps every row already written.
"""

from __future__ import annotations

import copy
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capture.keys import PER_LAYER_CHECKPOINTS, Capture, CheckpointKey, all_checkpoints
from ..comparison import ComparisonResult, Tolerance, compare, json_safe
from ..config import default_database_path, merge_config
from ..errors import (
    BackendInitializationError,
    DatabaseError,
    DebugFrameworkError,
    ModelLoadingError,
    ValidationError,
)
from ..models.debug_session import DebugSession, capture_environment
from ..models.validation_report import summarize_checkpoints
from .database_manager import TERMINAL_STATUSES, DatabaseManager

__all__ = [
    "ValidationEngine",
    "ValidationResult",
    "CheckpointOutcome",
    "LayerIsolation",
    "OracleJudgement",
    "SESSION_DEFAULTS",
    "MODEL_TOLERANCES",
    "resolve_tolerance",
    "resolve_alternative_backend",
]

#: Session configuration keys and their defaults (see docs/validation.md).
SESSION_DEFAULTS: dict[str, Any] = {
    # the spec's keys
    "enabled_checkpoints": None,  # None = all; names ("post_mlp") and/or keys ("post_mlp:3")
    "precision_thresholds": {},  # {"rtol", "atol", "pass_rule", ..., "<checkpoint>[:layer]": {...}}
    "tensor_recording_enabled": False,
    "performance_profiling_enabled": True,
    "profile_memory_usage": False,
    "profile_execution_time": True,
    # the engine's own
    "layers": None,  # [start, stop): per-layer checkpoints of these layers only
    "isolate": "auto",  # True: required; "auto": where both backends support run_layer; False: off
    "oracle": False,
    "oracle_multiplier": 2.0,
    "oracle_floor": 1e-5,
    "oracle_metric": "rmse",
    "noise_floor": False,
    "seed": 0,
    "input_text": None,  # str or list of str (needs the model's tokenizer)
    "max_length": None,
    "input_shape": [2, 16],  # [batch, length] of seeded random token ids when no text is given
    "pad_lengths": None,  # random inputs: padding per row (default: the second row a quarter padded)
    "dtype": None,  # the alternative's compute dtype (default: the backend's)
    "reference_dtype": None,  # default: float64 for python_reference; the alternative's in oracle mode
    "device": "cpu",  # the alternative's device
    "reference_device": "cpu",
    "reference_options": {},  # keyword arguments of get_backend(reference, ...)
    "alternative_options": {},
    "tensor_recording_limit": None,  # default: the framework config's
    "tensor_recording_byte_budget": None,
}

_ORACLE_METRICS = ("rmse", "max_abs_error", "mean_abs_error", "rel_l2_error")
_TOL_FIELDS = ("rtol", "atol", "equal_nan", "pass_rule", "max_mismatch_percent", "outlier_factor")

#: Default whole-model tolerances by the less precise compute dtype of the pair. Errors accumulate
#: through a model's layers, so these are looser than torch.testing's per-op defaults.
MODEL_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-7, atol=1e-7),
    "float32": Tolerance(rtol=1e-4, atol=1e-4),
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=5e-2, atol=5e-2),
}
_PRECISION_ORDER = ("float64", "float32", "float16", "bfloat16")

Progress = Callable[[str, int, int], None]


# ------------------------------------------------------------------------------------------------
# configuration helpers
# ------------------------------------------------------------------------------------------------


def _less_precise(a: str, b: str) -> str:
    ia = _PRECISION_ORDER.index(a) if a in _PRECISION_ORDER else 1
    ib = _PRECISION_ORDER.index(b) if b in _PRECISION_ORDER else 1
    return _PRECISION_ORDER[max(ia, ib)]


def resolve_tolerance(thresholds: Mapping[str, Any] | None, key: CheckpointKey, dtype: str) -> Tolerance:
    """The tolerance of checkpoint ``key``: the dtype default, then the global fields of
    ``thresholds``, then ``thresholds[name]``, then ``thresholds["name:layer"]``."""
    tol = MODEL_TOLERANCES.get(dtype, MODEL_TOLERANCES["float32"])
    thresholds = thresholds or {}
    layers: list[Mapping[str, Any]] = [{k: v for k, v in thresholds.items() if k in _TOL_FIELDS}]
    for name in (key.name, str(key)):
        sub = thresholds.get(name)
        if isinstance(sub, Mapping):
            layers.append(sub)
    for layer in layers:
        unknown = set(layer) - set(_TOL_FIELDS)
        if unknown:
            raise ValidationError(
                f"unknown tolerance field(s) {sorted(unknown)} for checkpoint {key}",
                hint=f"use {', '.join(_TOL_FIELDS)}",
            )
        tol = tol.with_overrides(**layer)
    return tol


def _validate_session_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    merged = copy.deepcopy(SESSION_DEFAULTS)
    for key, value in (config or {}).items():
        if key not in SESSION_DEFAULTS:
            raise ValidationError(
                f"unknown session configuration key {key!r}",
                hint=f"known keys: {', '.join(SESSION_DEFAULTS)}",
            )
        merged[key] = copy.deepcopy(value)
    if merged["isolate"] not in (True, False, "auto"):
        raise ValidationError(f"isolate must be true, false or 'auto', got {merged['isolate']!r}")
    if merged["oracle_metric"] not in _ORACLE_METRICS:
        raise ValidationError(f"oracle_metric must be one of {', '.join(_ORACLE_METRICS)}")
    for key in ("oracle_multiplier", "oracle_floor"):
        v = merged[key]
        if not isinstance(v, (int, float)) or not v >= 0:
            raise ValidationError(f"{key} must be a non-negative number, got {v!r}")
    if not isinstance(merged["precision_thresholds"], Mapping):
        raise ValidationError("precision_thresholds must be a mapping like {'rtol': 1e-4, 'atol': 1e-5}")
    shape = merged["input_shape"]
    if not (isinstance(shape, Sequence) and len(shape) == 2 and all(isinstance(v, int) and v > 0 for v in shape)):
        raise ValidationError(f"input_shape must be [batch, length] of positive ints, got {shape!r}")
    if merged["layers"] is not None:
        lo_hi = merged["layers"]
        if not (isinstance(lo_hi, Sequence) and len(lo_hi) == 2 and 0 <= int(lo_hi[0]) <= int(lo_hi[1])):
            raise ValidationError(f"layers must be [start, stop) with 0 <= start <= stop, got {lo_hi!r}")
    return merged


def _enabled_keys(config: Mapping[str, Any], num_layers: int) -> list[CheckpointKey]:
    """The enabled checkpoints in model order."""
    every = all_checkpoints(num_layers)
    enabled = config.get("enabled_checkpoints")
    layers = config.get("layers")
    if enabled is None:
        keys = list(every)
    else:
        if isinstance(enabled, str):
            enabled = [e for e in enabled.split(",") if e.strip()]
        names: set[str] = set()
        specific: set[CheckpointKey] = set()
        for item in enabled:
            text = str(item).strip() if not isinstance(item, (tuple, Mapping, CheckpointKey)) else item
            if isinstance(text, str) and ":" not in text:
                CheckpointKey(text, 0 if text in PER_LAYER_CHECKPOINTS else None).validate()
                names.add(text)
            else:
                k = CheckpointKey.parse(text)
                if k.layer is not None and k.layer >= num_layers:
                    raise ValidationError(f"checkpoint {k} is beyond the model's {num_layers} layers", checkpoint=str(k))
                specific.add(k)
        keys = [k for k in every if k.name in names or k in specific]
    if layers is not None:
        lo, hi = int(layers[0]), int(layers[1])
        keys = [k for k in keys if k.layer is None or lo <= k.layer < hi]
    if not keys:
        raise ValidationError("no checkpoint is enabled", hint="check enabled_checkpoints and layers")
    return keys


def resolve_alternative_backend(name: str, reference: str) -> tuple[str, str]:
    """``(backend name, why)``. ``"auto"`` is the registry's choice
    (:func:`debug_framework.backends.registry.select_alternative`): the first available backend
    of its preference order that is not the reference."""
    if name != "auto":
        return name, "requested"
    from ..backends import registry

    select = getattr(registry, "select_alternative", None)
    if not callable(select):
        raise BackendInitializationError(
            "'auto' backend selection is not available in this version of the backends registry",
            hint="name the alternative backend explicitly (see detect_available_backends())",
            backend="auto",
        )
    chosen, why = select(reference)
    return str(chosen), str(why)


# ------------------------------------------------------------------------------------------------
# result types
# ------------------------------------------------------------------------------------------------

_SUMMARY_METRICS = ("max_abs_error", "mean_abs_error", "rmse", "rel_l2_error", "cosine_similarity",
                    "mismatch_percent", "max_ulp_error")


def _metrics(result: ComparisonResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    out = {m: getattr(result, m) for m in _SUMMARY_METRICS}
    out["passed"] = result.passed
    out["reason"] = result.reason
    return out


def _metric(result: ComparisonResult | None, name: str) -> float:
    if result is None or not result.shape_match:
        return math.nan
    v = getattr(result, name)
    if v is None:  # no finite pairs at all
        return math.nan if result.numel else 0.0
    if result.nonfinite_mismatch_count:
        return math.inf
    return float(v)


@dataclass
class OracleJudgement:
    """The ratio rule at one checkpoint: ``alternative_error <= multiplier * reference_error + floor``."""

    metric: str
    reference_error: float
    alternative_error: float
    multiplier: float
    floor: float

    @property
    def bound(self) -> float:
        return self.multiplier * self.reference_error + self.floor

    @property
    def passed(self) -> bool:
        return bool(self.alternative_error <= self.bound)  # NaN compares False: fails

    @property
    def ratio(self) -> float:
        if self.reference_error == 0:
            return 0.0 if self.alternative_error == 0 else math.inf
        return self.alternative_error / self.reference_error

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "reference_error": self.reference_error,
                "alternative_error": self.alternative_error, "multiplier": self.multiplier,
                "floor": self.floor, "bound": self.bound, "ratio": self.ratio, "passed": self.passed}


@dataclass
class CheckpointOutcome:
    """One enabled checkpoint: the comparison, the verdict used, and isolation/oracle details."""

    key: CheckpointKey
    comparison: ComparisonResult
    passed: bool
    reason: str | None
    introduced: ComparisonResult | None = None  # the alternative's single-layer replay on the reference's input
    carried_in: ComparisonResult | None = None  # the error at the layer's input in the full run
    oracle: OracleJudgement | None = None
    run_to_run: dict[str, float] | None = None  # noise floor: max |run1 - run2| per side

    @property
    def introduces_error(self) -> bool | None:
        return None if self.introduced is None else not self.introduced.passed

    def row(self) -> dict[str, Any]:
        """The database row: every metric of the comparison plus the engine's fields."""
        d = self.comparison.to_dict()
        d.update(checkpoint=self.key.name, layer=self.key.layer, passed=self.passed, reason=self.reason,
                 tolerance_passed=self.comparison.passed)
        if self.introduced is not None:
            d["introduced_error"] = _metric(self.introduced, "max_abs_error")
            d["introduces_error"] = self.introduces_error
            d["introduced"] = _metrics(self.introduced)
        if self.carried_in is not None:
            d["propagated_error"] = _metric(self.carried_in, "max_abs_error")
        if self.oracle is not None:
            d["oracle"] = self.oracle.to_dict()
        if self.run_to_run is not None:
            d["run_to_run"] = dict(self.run_to_run)
        return d

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            **self.key.to_json(),
            "passed": self.passed,
            "reason": self.reason,
            "metrics": _metrics(self.comparison),
            "tolerance": self.comparison.tolerance.to_dict(),
            "introduced": _metrics(self.introduced),
            "carried_in": _metrics(self.carried_in),
            "introduces_error": self.introduces_error,
            "oracle": None if self.oracle is None else self.oracle.to_dict(),
            "run_to_run": self.run_to_run,
        })


@dataclass
class LayerIsolation:
    """What layer ``layer`` does to the error: introduced (replayed on the reference's input) vs
    carried in (the error at its input in the full run) vs total (its output in the full run)."""

    layer: int
    carried_in: ComparisonResult
    introduced_attention: ComparisonResult | None
    introduced_mlp: ComparisonResult
    total: ComparisonResult | None
    alternative_replay_s: float = 0.0

    @property
    def introduces(self) -> bool:
        attn = self.introduced_attention is not None and not self.introduced_attention.passed
        return attn or not self.introduced_mlp.passed

    @property
    def block(self) -> str | None:
        """Where the error starts inside the layer: ``"attention"``, ``"mlp"`` or None."""
        if self.introduced_attention is not None and not self.introduced_attention.passed:
            return "attention"
        return "mlp" if not self.introduced_mlp.passed else None

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "layer": self.layer,
            "introduces_error": self.introduces,
            "block": self.block,
            "introduced_error": _metric(self.introduced_mlp, "max_abs_error"),
            "propagated_error": _metric(self.carried_in, "max_abs_error"),
            "total_error": _metric(self.total, "max_abs_error") if self.total is not None else None,
            "introduced_attention": _metrics(self.introduced_attention),
            "introduced_mlp": _metrics(self.introduced_mlp),
            "carried_in": _metrics(self.carried_in),
            "alternative_replay_s": self.alternative_replay_s,
        })


@dataclass
class ValidationResult:
    """Everything one validation computed: per-checkpoint outcomes in model order, the verdict,
    the first divergence, isolation per layer, oracle/noise-floor reports and performance."""

    session_id: str
    model_path: str
    reference_backend: str
    alternative_backend: str
    reference_dtype: str
    alternative_dtype: str
    results: list[CheckpointOutcome]
    isolation: list[LayerIsolation] | None = None
    isolation_note: str | None = None
    oracle: dict[str, Any] | None = None
    noise_floor: dict[str, Any] | None = None
    performance: dict[str, Any] = field(default_factory=dict)
    recordings: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"

    @property
    def first_divergence(self) -> CheckpointOutcome | None:
        """The earliest checkpoint (model order) that failed."""
        return next((r for r in self.results if not r.passed), None)

    @property
    def introducing_layers(self) -> list[int]:
        """Layers that introduce error on their own (isolation), even after an earlier divergence."""
        return [iso.layer for iso in self.isolation or [] if iso.introduces]

    def summary(self) -> dict[str, Any]:
        """The session's ``results`` summary (what reports read)."""
        first = self.first_divergence
        return json_safe({
            "verdict": self.verdict,
            "checkpoints": len(self.results),
            "failed": sum(not r.passed for r in self.results),
            "first_divergence": None if first is None else _first_divergence_dict(first),
            "introducing_layers": self.introducing_layers if self.isolation is not None else None,
            "isolation": None if self.isolation is None else [i.to_dict() for i in self.isolation],
            "isolation_note": self.isolation_note,
            "oracle": self.oracle,
            "noise_floor": self.noise_floor,
            "performance": self.performance,
            "recordings": self.recordings,
            "reference_dtype": self.reference_dtype,
            "alternative_dtype": self.alternative_dtype,
        })

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite floats as "NaN"/"Infinity"/"-Infinity" strings)."""
        return json_safe({
            "session_id": self.session_id,
            "model_path": self.model_path,
            "reference_backend": self.reference_backend,
            "alternative_backend": self.alternative_backend,
            **self.summary(),
            "results": [r.to_dict() for r in self.results],
        })


def _first_divergence_dict(o: CheckpointOutcome) -> dict[str, Any]:
    c = o.comparison
    return {
        **o.key.to_json(),
        "reason": o.reason,
        "max_abs_error": c.max_abs_error,
        "mean_abs_error": c.mean_abs_error,
        "max_rel_error": c.max_rel_error,
        "rel_l2_error": c.rel_l2_error,
        "cosine_similarity": c.cosine_similarity,
        "mismatch_percent": c.mismatch_percent,
        "tolerance": c.tolerance.to_dict(),
        "worst": [w.to_dict() for w in c.worst[:3]],
        "introduces_error": o.introduces_error,
        "oracle": None if o.oracle is None else o.oracle.to_dict(),
    }


# ------------------------------------------------------------------------------------------------
# profiling helpers
# ------------------------------------------------------------------------------------------------


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _MemorySampler:
    """Peak memory while a block runs: CUDA's allocator peak on a CUDA device, else the process's
    resident set sampled every 2 ms (Linux ``/proc/self/statm``)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.result: dict[str, Any] = {}

    def __enter__(self) -> _MemorySampler:
        self._stop = threading.Event()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._base = _rss_bytes()
        self._peak = self._base or 0
        if self._base is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            v = _rss_bytes()
            if v is not None and v > self._peak:
                self._peak = v

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self.result = {"method": "torch.cuda.max_memory_allocated", "peak_bytes": int(peak),
                           "peak_increase_bytes": int(peak - self._base)}
            return
        if self._base is None:
            self.result = {"method": None, "note": "peak memory is not measurable on this platform"}
            return
        self._thread.join()
        v = _rss_bytes() or 0
        self._peak = max(self._peak, v)
        self.result = {"method": "resident set size, sampled every 2 ms", "peak_bytes": int(self._peak),
                       "peak_increase_bytes": int(self._peak - self._base)}


@contextmanager
def _layer_timer(backend: Any, enabled: bool) -> Iterator[dict[str, Any]]:
    """Per-layer wall time of one forward where measurable: forward hooks on the layer modules of a
    torch-module backend, or the per-layer function of the NumPy reference. Fills ``out``."""
    out: dict[str, Any] = {"per_layer_s": None, "method": None}
    if not enabled:
        yield out
        return
    starts: dict[int, float] = {}
    times: dict[int, float] = {}
    module = getattr(backend, "module", None)
    layer_modules = getattr(backend, "layer_modules", None)
    reference = getattr(backend, "reference", None)
    handles: list[Any] = []
    restore: Callable[[], None] | None = None
    device = str(getattr(backend, "device", "cpu"))

    def sync() -> None:
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    try:
        if module is not None and isinstance(layer_modules, Mapping) and layer_modules:
            from ..capture.hooks import find_module

            for i, name in layer_modules.items():
                mod = find_module(module, name)

                def pre(_m: Any, _a: Any, i: int = i) -> None:
                    sync()
                    starts[i] = time.perf_counter()

                def post(_m: Any, _a: Any, _o: Any, i: int = i) -> None:
                    sync()
                    times[i] = times.get(i, 0.0) + time.perf_counter() - starts.get(i, time.perf_counter())

                handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
            out["method"] = "forward hooks on the layer modules"
        elif reference is not None and callable(getattr(reference, "layer", None)):
            original = reference.layer

            def timed(i: int, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return original(i, *args, **kwargs)
                finally:
                    times[i] = times.get(i, 0.0) + time.perf_counter() - t0

            reference.layer = timed

            def restore() -> None:
                del reference.layer

            out["method"] = "timing of the reference's per-layer function"
        yield out
    finally:
        for h in handles:
            h.remove()
        if restore is not None:
            restore()
    n = getattr(getattr(backend, "model", None), "num_layers", None)
    if out["method"] and n and len(times) == n:
        out["per_layer_s"] = [times[i] for i in range(n)]
    elif out["method"]:
        out["note"] = "per-layer time not measurable: the layers did not run one by one (compiled or fused)"
        out["method"] = None


# ------------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------------


def _backend_info(backend: Any, dtype: str, device: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"name": getattr(backend, "name", "?"), "class": type(backend).__qualname__,
                            "module": type(backend).__module__, "dtype": dtype, "device": device}
    try:
        import numpy
        import torch

        info["torch"] = torch.__version__
        info["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover
        pass
    fn = getattr(backend, "version_info", None)
    if callable(fn):
        try:
            more = fn()
            if isinstance(more, Mapping):
                info["versions"] = {str(k): v for k, v in more.items()}
        except Exception as exc:  # noqa: BLE001 - informational only
            info["versions_error"] = str(exc)
    info.update(extra or {})
    return info


class ValidationEngine:
    """Creates, runs and reads validation sessions stored in one SQLite database.

    Args:
        database_path: the database file; default ``config["database_path"]``
            (``~/.pie/debug/debug_framework.db``).
        config: the framework configuration (``DEFAULT_CONFIG`` keys); environment overrides are
            applied by the caller (``debug_framework.get_framework_config()``), never read here.
    """

    def __init__(self, database_path: str | os.PathLike[str] | None = None, *,
                 config: Mapping[str, Any] | None = None) -> None:
        self.config = merge_config(config)
        path = database_path if database_path is not None else default_database_path(self.config)
        self.db = DatabaseManager(path)
        self.database_path = self.db.database_path
        self.inputs_dir = self.database_path.parent / f"{self.database_path.stem}_inputs"

    def __repr__(self) -> str:
        return f"ValidationEngine({str(self.database_path)!r})"

    # ---------------------------------------------------------------- sessions

    def create_session(
        self,
        model_path: str | os.PathLike[str],
        config: Mapping[str, Any] | None = None,
        reference_backend: str = "python_reference",
        alternative_backend: str = "auto",
        *,
        session_id: str | None = None,
    ) -> str:
        """Create a session (status ``created``): the model is loaded and its digest recorded, both
        backends are checked to be available, the inputs are built and saved beside the database.

        Raises:
            ModelLoadingError (DF004), BackendInitializationError (DF002), ValidationError (DF005)
            for a bad configuration, DatabaseError (DF003).
        """
        from ..backends import get_backend
        from ..modelio import ModelInputs, load_model

        cfg = _validate_session_config(config)
        model = load_model(model_path)
        keys = _enabled_keys(cfg, model.num_layers)
        alt_name, why = resolve_alternative_backend(alternative_backend, reference_backend)
        ref = get_backend(reference_backend, **cfg["reference_options"])
        alt = get_backend(alt_name, **cfg["alternative_options"])
        alt_dtype = str(cfg["dtype"] or getattr(alt, "default_dtype", "float32"))
        ref_dtype = self._reference_dtype(ref, cfg, alt_dtype)
        for b, dt in ((ref, ref_dtype), (alt, alt_dtype)):
            supported = getattr(b, "supported_dtypes", None)
            if supported is not None and dt not in supported:
                raise BackendInitializationError(f"dtype {dt!r} is not supported",
                                                 hint=f"use one of {', '.join(supported)}", backend=b.name)
        cfg["dtype"], cfg["reference_dtype"] = alt_dtype, ref_dtype

        if cfg["input_text"] is not None:
            inputs = ModelInputs.from_text(model.tokenizer, cfg["input_text"], max_length=cfg["max_length"])
        else:
            batch, length = cfg["input_shape"]
            pads = cfg["pad_lengths"]
            if pads is None:
                pads = [0] + [length // 4] * (batch - 1) if batch > 1 else [0]
            inputs = ModelInputs.random(model.config.vocab_size, batch, length, seed=int(cfg["seed"]),
                                        pad_lengths=list(pads))
        sid = session_id or uuid.uuid4().hex
        try:
            self.inputs_dir.mkdir(parents=True, exist_ok=True)
            inputs_path = inputs.save(self.inputs_dir / f"{sid}.safetensors")
        except OSError as exc:
            raise DatabaseError(f"cannot save the session inputs: {exc}", database=str(self.database_path)) from exc

        governing = _less_precise(ref_dtype, alt_dtype)
        tolerances = {
            "governing_dtype": governing,
            "precision_thresholds": cfg["precision_thresholds"],
            "per_checkpoint": {str(k): resolve_tolerance(cfg["precision_thresholds"], k, governing).to_dict()
                               for k in keys},
        }
        session = DebugSession(
            session_id=sid, model_path=str(model_path), reference_backend=reference_backend,
            alternative_backend=alt_name, config=cfg, weights_digest=model.digest, tolerances=tolerances,
            seed=int(cfg["seed"]), inputs_ref=str(inputs_path), environment=capture_environment(cfg["device"]),
            reference_backend_info=_backend_info(ref, ref_dtype, cfg["reference_device"]),
            alternative_backend_info=_backend_info(alt, alt_dtype, cfg["device"],
                                                   {"requested": alternative_backend, "selected_because": why}),
            db=self.db,
        )
        session.save()
        return sid

    @staticmethod
    def _reference_dtype(ref: Any, cfg: Mapping[str, Any], alt_dtype: str) -> str:
        if cfg["reference_dtype"]:
            return str(cfg["reference_dtype"])
        supported = tuple(getattr(ref, "supported_dtypes", ()) or ())
        if cfg["oracle"] and alt_dtype in supported:
            return alt_dtype  # the ratio rule compares implementations at the same precision
        return str(getattr(ref, "default_dtype", "float32"))

    def _session(self, session_id: str) -> dict[str, Any]:
        row = self.db.get_session(session_id)
        if row is None:
            raise ValidationError(f"no session {session_id!r} in {self.database_path}", session=session_id,
                                  hint="create it with create_session() or list sessions with session_report --list")
        return row

    def execute_validation(self, session_id: str, *, progress: Progress | None = None) -> dict[str, Any]:
        """Run the session's validation; returns :meth:`ValidationResult.to_dict`."""
        return self.run(session_id, progress=progress).to_dict()

    def run(self, session_id: str, *, progress: Progress | None = None) -> ValidationResult:
        """Run the session (status created -> running -> passed|failed, or error) and return the
        typed :class:`ValidationResult`. ``progress(stage, done, total)`` is called as stages finish."""
        row = self._session(session_id)
        if row["status"] != "created":
            raise ValidationError(
                f"session {session_id} is {row['status']!r}; only a 'created' session can be executed",
                session=session_id, hint="create a new session to run the validation again",
            )
        session = DebugSession.from_dict(row, db=self.db)
        session.update_status("running")
        try:
            result = self._execute(session, progress or (lambda *_: None))
        except BaseException as exc:
            message = str(exc) or type(exc).__name__
            try:
                session.update_status("error", error_message=message)
            except DebugFrameworkError:  # pragma: no cover - the database itself failed
                pass
            if isinstance(exc, DebugFrameworkError) or not isinstance(exc, Exception):
                raise
            raise ValidationError(f"the validation failed to execute: {type(exc).__name__}: {exc}",
                                  session=session_id) from exc
        return result

    # ---------------------------------------------------------------- the run itself

    def _execute(self, session: DebugSession, progress: Progress) -> ValidationResult:
        from ..backends import get_backend
        from ..modelio import ModelInputs, load_model

        t_start = time.perf_counter()
        cfg = _validate_session_config(session.config)
        profiling = bool(cfg["performance_profiling_enabled"])
        per_layer = profiling and bool(cfg["profile_execution_time"])
        memory = profiling and bool(cfg["profile_memory_usage"])
        stages = ["load", "reference", "alternative", "compare"]
        if cfg["isolate"]:
            stages.append("isolation")
        if cfg["oracle"]:
            stages.append("oracle")
        if cfg["noise_floor"]:
            stages.append("noise floor")
        stages.append("store")
        step = iter(range(1, len(stages) + 1))

        def done(stage: str) -> None:
            progress(stage, next(step), len(stages))

        t0 = time.perf_counter()
        model = load_model(session.model_path)
        if session.weights_digest and model.digest != session.weights_digest:
            raise ModelLoadingError(
                "the weights changed since the session was created (digest mismatch)",
                file=session.model_path, hint="create a new session for the new weights",
            )
        if not session.inputs_ref:
            raise ValidationError("the session has no saved inputs", session=session.session_id)
        inputs = ModelInputs.load(session.inputs_ref)
        load_s = time.perf_counter() - t0
        keys = _enabled_keys(cfg, model.num_layers)
        ref_dtype, alt_dtype = str(cfg["reference_dtype"]), str(cfg["dtype"])
        governing = _less_precise(ref_dtype, alt_dtype)
        thresholds = cfg["precision_thresholds"]
        done("load")

        ref = get_backend(session.reference_backend, **cfg["reference_options"])
        alt = get_backend(session.alternative_backend, **cfg["alternative_options"])
        ref_prep = self._prepare(ref, model, ref_dtype, cfg["reference_device"])
        alt_prep = self._prepare(alt, model, alt_dtype, cfg["device"])
        isolate = cfg["isolate"]
        can_isolate, isolation_note = self._can_isolate(ref, alt)
        if isolate is True and not can_isolate:
            raise ValidationError(f"isolation was requested but {isolation_note}", session=session.session_id,
                                  hint="set isolate to 'auto' or false, or give the backend a run_layer")
        isolating = bool(isolate) and can_isolate
        if not isolate:
            isolation_note = "isolation not requested"
        # Isolation needs every layer's checkpoints from both runs; only the enabled ones are reported.
        taps = all_checkpoints(model.num_layers) if isolating else keys

        perf: dict[str, Any] = {"model_load_s": load_s}
        ref_cap, perf["reference"] = self._run_backend(ref, model, ref_dtype, cfg["reference_device"], inputs, taps,
                                                       isolating, per_layer, memory, ref_prep)
        done("reference")
        alt_cap, perf["alternative"] = self._run_backend(alt, model, alt_dtype, cfg["device"], inputs, taps,
                                                         isolating, per_layer, memory, alt_prep)
        done("alternative")

        t0 = time.perf_counter()
        outcomes: list[CheckpointOutcome] = []
        for key in keys:
            tol = resolve_tolerance(thresholds, key, governing)
            if key not in alt_cap:
                comp = ComparisonResult(passed=False, reason=f"the alternative backend produced no tensor for {key}",
                                        tolerance=tol, name=str(key))
            elif key not in ref_cap:
                comp = ComparisonResult(passed=False, reason=f"the reference backend produced no tensor for {key}",
                                        tolerance=tol, name=str(key))
            else:
                comp = compare(ref_cap[key], alt_cap[key], tolerance=tol, check_dtype=False, name=str(key))
            outcomes.append(CheckpointOutcome(key=key, comparison=comp, passed=comp.passed, reason=comp.reason))
        perf["comparison_s"] = time.perf_counter() - t0
        # Rows go in now, in model order, so nothing compared is lost if a later stage fails.
        self.db.add_checkpoint_results(session.session_id, [o.row() for o in outcomes])
        done("compare")

        isolation: list[LayerIsolation] | None = None
        if isolating:
            t0 = time.perf_counter()
            isolation = self._isolate(ref, alt, ref_cap, alt_cap, inputs, model.num_layers, thresholds, governing, cfg)
            by_layer = {iso.layer: iso for iso in isolation}
            for o in outcomes:
                iso = by_layer.get(o.key.layer) if o.key.layer is not None else None
                if iso is None:
                    continue
                o.carried_in = iso.carried_in
                o.introduced = iso.introduced_attention if o.key.name == "post_attention" else iso.introduced_mlp
            perf["isolation_s"] = time.perf_counter() - t0
            self.db.add_checkpoint_results(session.session_id, [o.row() for o in outcomes])
            isolation_note = None
            done("isolation")

        oracle_report: dict[str, Any] | None = None
        if cfg["oracle"]:
            t0 = time.perf_counter()
            oracle_report = self._oracle(session, ref, ref_cap, alt_cap, ref_dtype, model, inputs, keys, outcomes,
                                         cfg, per_layer, memory, perf)
            perf["oracle_s"] = time.perf_counter() - t0
            self.db.add_checkpoint_results(session.session_id, [o.row() for o in outcomes])
            done("oracle")

        noise: dict[str, Any] | None = None
        if cfg["noise_floor"]:
            t0 = time.perf_counter()
            noise = {}
            for side, backend, cap in (("reference", ref, ref_cap), ("alternative", alt, alt_cap)):
                again = backend.run(inputs, keys)
                diffs: dict[str, float] = {}
                for key in keys:
                    if key in cap and key in again:
                        r = compare(cap[key], again[key], rtol=0.0, atol=0.0, equal_nan=True, check_dtype=False)
                        diffs[str(key)] = _metric(r, "max_abs_error") if not r.passed else 0.0
                nondet = [k for k, v in diffs.items() if v != 0.0]
                noise[side] = {"backend": backend.name, "deterministic": not nondet,
                               "max_abs_diff": max(diffs.values(), default=0.0), "nondeterministic_keys": nondet,
                               "per_checkpoint": diffs}
            for o in outcomes:
                o.run_to_run = {side: noise[side]["per_checkpoint"].get(str(o.key), math.nan) for side in noise}
            perf["noise_floor_s"] = time.perf_counter() - t0
            self.db.add_checkpoint_results(session.session_id, [o.row() for o in outcomes])
            done("noise floor")

        recordings = None
        if cfg["tensor_recording_enabled"]:
            recordings = self._record(session.session_id, outcomes, ref_cap, alt_cap, cfg)

        perf["total_s"] = time.perf_counter() - t_start
        if not profiling:
            perf = {"total_s": perf["total_s"], "note": "performance profiling disabled"}
        result = ValidationResult(
            session_id=session.session_id, model_path=session.model_path,
            reference_backend=session.reference_backend, alternative_backend=session.alternative_backend,
            reference_dtype=ref_dtype, alternative_dtype=alt_dtype, results=outcomes, isolation=isolation,
            isolation_note=isolation_note, oracle=oracle_report, noise_floor=noise, performance=perf,
            recordings=recordings,
        )
        session.results = result.summary()
        session.save()
        session.update_status(result.verdict)
        done("store")
        return result

    @staticmethod
    def _can_isolate(ref: Any, alt: Any) -> tuple[bool, str]:
        """Both backends (already prepared) can replay a single layer."""
        for side, b in (("reference", ref), ("alternative", alt)):
            if not callable(getattr(b, "run_layer", None)):
                return False, f"the {side} backend {b.name!r} cannot run a single layer (no run_layer)"
            runner = getattr(b, "runner", None)
            if runner is not None and hasattr(b, "builder") and not callable(getattr(runner, "run_layer", None)):
                return False, f"the {side} user backend {b.name!r} has no run_layer(i, hidden_in, inputs)"
        return True, ""

    @staticmethod
    def _prepare(backend: Any, model: Any, dtype: str, device: str) -> float:
        t0 = time.perf_counter()
        backend.prepare(model, dtype, device)
        return time.perf_counter() - t0

    def _run_backend(self, backend: Any, model: Any, dtype: str, device: str, inputs: Any, taps: list[CheckpointKey],
                     layer_inputs: bool, per_layer: bool, memory: bool, prepare_s: float | None = None,
                     ) -> tuple[Capture, dict[str, Any]]:
        if prepare_s is None:
            prepare_s = self._prepare(backend, model, dtype, device)
        mem = _MemorySampler(device) if memory else None
        t0 = time.perf_counter()
        with _layer_timer(backend, per_layer) as timing:
            if mem is not None:
                with mem:
                    cap = backend.run(inputs, taps, capture_layer_inputs=layer_inputs)
            else:
                cap = backend.run(inputs, taps, capture_layer_inputs=layer_inputs)
        wall = time.perf_counter() - t0
        stats: dict[str, Any] = {"backend": backend.name, "dtype": dtype, "device": device, "prepare_s": prepare_s,
                                 "forward_s": float(cap.elapsed_s), "wall_s": wall}
        if per_layer:
            stats["per_layer_s"] = timing["per_layer_s"]
            stats["per_layer_method"] = timing["method"]
            if timing.get("note"):
                stats["per_layer_note"] = timing["note"]
        if mem is not None:
            stats["memory"] = mem.result
        return cap, stats

    def _isolate(self, ref: Any, alt: Any, ref_cap: Capture, alt_cap: Capture, inputs: Any, num_layers: int,
                 thresholds: Mapping[str, Any], governing: str, cfg: Mapping[str, Any]) -> list[LayerIsolation]:
        lo, hi = (0, num_layers) if cfg["layers"] is None else (int(cfg["layers"][0]), min(int(cfg["layers"][1]), num_layers))
        out: list[LayerIsolation] = []
        for i in range(lo, hi):
            ref_in = ref_cap.layer_inputs.get(i)
            if ref_in is None:
                raise ValidationError(f"the reference backend did not record the input of layer {i}",
                                      hint="its run() must fill Capture.layer_inputs when capture_layer_inputs=True")
            alt_in = alt_cap.layer_inputs.get(i)
            if alt_in is None:  # the layer's input is the previous layer's output
                prev = CheckpointKey("post_embedding") if i == 0 else CheckpointKey("post_mlp", i - 1)
                alt_in = alt_cap.tensors.get(prev)
            k_attn, k_mlp = CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i)
            tol_in = resolve_tolerance(thresholds, CheckpointKey("post_embedding") if i == 0
                                       else CheckpointKey("post_mlp", i - 1), governing)
            if alt_in is None:
                carried = ComparisonResult(passed=False, reason=f"the alternative's input to layer {i} is unknown",
                                           tolerance=tol_in, name=f"layer {i} input")
            else:
                carried = compare(ref_in, alt_in, tolerance=tol_in, check_dtype=False, name=f"layer {i} input")
            replay = alt.run_layer(i, ref_in, inputs)
            tol_a, tol_m = (resolve_tolerance(thresholds, k, governing) for k in (k_attn, k_mlp))
            intro_attn = None
            if k_attn in replay and k_attn in ref_cap:
                intro_attn = compare(ref_cap[k_attn], replay[k_attn], tolerance=tol_a, check_dtype=False,
                                     name=f"{k_attn} replayed")
            if k_mlp in replay:
                intro_mlp = compare(ref_cap[k_mlp], replay[k_mlp], tolerance=tol_m, check_dtype=False,
                                    name=f"{k_mlp} replayed")
            else:
                intro_mlp = ComparisonResult(passed=False, reason=f"run_layer({i}) returned no post_mlp tensor",
                                             tolerance=tol_m, name=f"{k_mlp} replayed")
            total = None
            if k_mlp in alt_cap and k_mlp in ref_cap:
                total = compare(ref_cap[k_mlp], alt_cap[k_mlp], tolerance=tol_m, check_dtype=False, name=str(k_mlp))
            out.append(LayerIsolation(layer=i, carried_in=carried, introduced_attention=intro_attn,
                                      introduced_mlp=intro_mlp, total=total,
                                      alternative_replay_s=float(replay.elapsed_s)))
        return out

    def _oracle(self, session: DebugSession, ref: Any, ref_cap: Capture, alt_cap: Capture, ref_dtype: str,
                model: Any, inputs: Any, keys: list[CheckpointKey], outcomes: list[CheckpointOutcome],
                cfg: Mapping[str, Any], per_layer: bool, memory: bool, perf: dict[str, Any]) -> dict[str, Any]:
        from ..backends import get_backend

        if session.reference_backend == "python_reference" and ref_dtype == "float64":
            oracle_cap = ref_cap  # the reference already is the float64 oracle
            perf["oracle"] = {"note": "the reference backend is python_reference in float64: reused as the oracle"}
        else:
            oracle = get_backend("python_reference")
            oracle_cap, perf["oracle"] = self._run_backend(oracle, model, "float64", "cpu", inputs, keys, False,
                                                           per_layer, memory)
        metric = str(cfg["oracle_metric"])
        m, floor = float(cfg["oracle_multiplier"]), float(cfg["oracle_floor"])
        failed = []
        for o in outcomes:
            k = o.key
            if k not in oracle_cap or k not in ref_cap or k not in alt_cap:
                o.passed, o.reason = False, o.reason or f"no tensor for {k} from one of the three runs"
                failed.append(str(k))
                continue
            e_ref = _metric(compare(oracle_cap[k], ref_cap[k], check_dtype=False), metric)
            e_alt = _metric(compare(oracle_cap[k], alt_cap[k], check_dtype=False), metric)
            o.oracle = OracleJudgement(metric, e_ref, e_alt, m, floor)
            o.passed = o.oracle.passed
            if o.passed:
                o.reason = None
            else:
                o.reason = (f"oracle ratio rule: {metric} vs float64 {e_alt:.3e} > {m:g} x {e_ref:.3e} + {floor:g}")
                failed.append(str(k))
        return {"oracle_backend": "python_reference", "oracle_dtype": "float64", "metric": metric,
                "multiplier": m, "floor": floor, "failed": failed,
                "rule": "alternative_error <= multiplier * reference_error + floor (errors against the float64 oracle)"}

    def _record(self, session_id: str, outcomes: list[CheckpointOutcome], ref_cap: Capture, alt_cap: Capture,
                cfg: Mapping[str, Any]) -> str:
        from ..models.tensor_comparison import TensorComparison
        from .tensor_store import RecordingCandidate, TensorStore

        limit = cfg["tensor_recording_limit"] or self.config.get("tensor_recording_limit")
        store = TensorStore.beside_database(self.database_path, tensor_recording_limit=limit,
                                            byte_budget=cfg["tensor_recording_byte_budget"])
        cands = []
        for o in outcomes:
            score = _metric(o.comparison, "max_abs_error")
            for side, cap in (("reference", ref_cap), ("alternative", alt_cap)):
                if o.key in cap:
                    cands.append(RecordingCandidate(o.key.name, o.key.layer, side, cap[o.key], score=score))
        outcome = store.record_session(self.db, session_id, cands)
        kept = {(r.checkpoint, r.layer, r.side): r.recording_id for r in outcome.kept}
        by_key = {(o.key.name, o.key.layer): o for o in outcomes}
        for (name, layer), o in by_key.items():
            rid, aid = kept.get((name, layer, "reference")), kept.get((name, layer, "alternative"))
            if rid and aid:
                TensorComparison.from_comparison_result(session_id, o.row(), reference_recording_id=rid,
                                                        alternative_recording_id=aid).save(self.db)
        return outcome.summary()

    # ---------------------------------------------------------------- reading back

    def get_session_results(self, session_id: str) -> dict[str, Any]:
        """The stored session (status, provenance, summary) with every checkpoint row in model order."""
        row = self._session(session_id)
        rows = self.db.get_checkpoint_results(session_id)
        results = row.get("results") or {}
        return json_safe({
            "session_id": session_id,
            "status": row["status"],
            "error_message": row.get("error_message"),
            "verdict": results.get("verdict"),
            "first_divergence": results.get("first_divergence"),
            "summary": summarize_checkpoints(rows),
            "results": results,
            "checkpoints": rows,
            "session": row,
        })

    def get_performance_metrics(self, session_id: str) -> dict[str, Any]:
        """Wall time per backend (and per layer where measured), peak memory when profiled."""
        row = self._session(session_id)
        results = row.get("results") or {}
        if row["status"] not in TERMINAL_STATUSES or "performance" not in results:
            raise ValidationError(f"session {session_id} has no performance metrics (status {row['status']!r})",
                                  session=session_id, hint="execute the session first")
        return dict(results["performance"])

    def list_sessions(self, **filters: Any) -> list[dict[str, Any]]:
        """Stored sessions, newest first (filters as :meth:`DatabaseManager.list_sessions`)."""
        return self.db.list_sessions(**filters)

    def cleanup_session(self, session_id: str, *, delete_records: bool = False, force: bool = False) -> bool:
        """Release a finished session's resources: its saved inputs file is kept unless
        ``delete_records``, which also deletes the session's rows (results, recordings) from the
        database. A running session is refused unless ``force`` (a session whose process was
        killed stays ``running``). Returns False when there is no such session."""
        row = self.db.get_session(session_id)
        if row is None:
            return False
        if row["status"] == "running" and not force:
            raise ValidationError(f"session {session_id} is running", session=session_id,
                                  hint="wait for it to finish")
        if delete_records:
            inputs_ref = row.get("inputs_ref")
            self.db.delete_session(session_id)
            if inputs_ref:
                p = Path(inputs_ref)
                if p.parent == self.inputs_dir and p.is_file():
                    p.unlink()
        return True
