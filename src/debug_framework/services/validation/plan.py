"""The validation plan: a session's configuration resolved once (defaults, checks, dtypes,
checkpoint keys, tolerances) so the stages read decisions instead of re-deriving them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...capture.keys import PER_LAYER_CHECKPOINTS, CheckpointKey, all_checkpoints
from ...comparison import Tolerance
from ...comparison.tolerance import DTYPE_EPS
from ...errors import ConfigurationError
from ...jsonio import JsonValue
from ...models.session_config import ORACLE_METRICS, SESSION_DEFAULTS, SessionConfig, validate_session_config

if TYPE_CHECKING:
    from ...modelio import LoadedModel

__all__ = [
    "SESSION_DEFAULTS",
    "MODEL_TOLERANCES",
    "ORACLE_METRICS",
    "ValidationPlan",
    "validate_session_config",
    "enabled_keys",
    "model_checkpoints",
    "resolve_tolerance",
    "resolve_alternative_backend",
    "less_precise",
    "DTYPE_EPS",
    "explicit_tolerance",
    "SessionConfig",
]

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

#: Machine epsilon (the gap above 1.0) of each compute dtype: the unit of the scale-relative floors.


def explicit_tolerance(thresholds: Mapping[str, JsonValue] | None, key: CheckpointKey) -> bool:
    """Whether ``precision_thresholds`` sets a tolerance for ``key``: a top-level field (every
    checkpoint), or an entry for its name or for the key itself. Where one is set, the checkpoint is
    judged by that tolerance, not by calibration."""
    thresholds = thresholds or {}
    if any(k in _TOL_FIELDS for k in thresholds):
        return True
    return any(isinstance(thresholds.get(name), Mapping) for name in (key.name, str(key)))


def less_precise(a: str, b: str) -> str:
    """The less precise of two dtype names (unknown names count as float32)."""
    ia = _PRECISION_ORDER.index(a) if a in _PRECISION_ORDER else 1
    ib = _PRECISION_ORDER.index(b) if b in _PRECISION_ORDER else 1
    return _PRECISION_ORDER[max(ia, ib)]


def resolve_tolerance(thresholds: Mapping[str, JsonValue] | None, key: CheckpointKey, dtype: str) -> Tolerance:
    """The tolerance of checkpoint ``key``: the dtype default, then the global fields of
    ``thresholds``, then ``thresholds[name]``, then ``thresholds["name:layer"]``."""
    tol = MODEL_TOLERANCES.get(dtype, MODEL_TOLERANCES["float32"])
    thresholds = thresholds or {}
    layers: list[Mapping[str, JsonValue]] = [{k: v for k, v in thresholds.items() if k in _TOL_FIELDS}]
    for name in (key.name, str(key)):
        sub = thresholds.get(name)
        if isinstance(sub, Mapping):
            layers.append(sub)
    for layer in layers:
        unknown = set(layer) - set(_TOL_FIELDS)
        if unknown:
            raise ConfigurationError(
                f"unknown tolerance field(s) {sorted(unknown)} for checkpoint {key}",
                hint=f"use {', '.join(_TOL_FIELDS)}",
            )
        tol = tol.with_overrides(**layer)  # type: ignore[arg-type]  # the fields' values, checked there
    return tol


def _named_keys(enabled: Sequence[str], num_layers: int) -> tuple[set[str], set[CheckpointKey]]:
    """Split ``enabled_checkpoints`` (:attr:`SessionConfig.enabled_checkpoints`) into whole names
    (``post_mlp``) and specific keys (``post_mlp:3``)."""
    names: set[str] = set()
    specific: set[CheckpointKey] = set()
    for text in enabled:
        if ":" not in text:
            CheckpointKey(text, 0 if text in PER_LAYER_CHECKPOINTS else None).validate()
            names.add(text)
            continue
        k = CheckpointKey.parse(text)
        if k.layer is not None and k.layer >= num_layers:
            raise ConfigurationError(f"checkpoint {k} is beyond the model's {num_layers} layers", checkpoint=str(k))
        specific.add(k)
    return names, specific


def model_checkpoints(model: LoadedModel) -> frozenset[CheckpointKey] | None:
    """The checkpoints a model declares it has (an ONNX file's: the boundaries found in its graph,
    ``config.checkpoint_tensors``), or None where every checkpoint of its layers exists."""
    found = getattr(getattr(model, "config", None), "checkpoint_tensors", None)
    return None if found is None else frozenset(CheckpointKey.parse(k) for k in found)


def enabled_keys(config: SessionConfig | Mapping[str, object], num_layers: int, router_layers: Sequence[int] = (),
                 available: Collection[CheckpointKey] | None = None) -> list[CheckpointKey]:
    """The enabled checkpoints in model order (``router_layers``: the layers whose router logits
    exist). By default every checkpoint, those of ``available`` only where the model declares what
    it has (a graph without a ``post_attention`` boundary: none asked for); checkpoints named in
    ``enabled_checkpoints`` are asked for as named (one the model lacks is reported missing)."""
    config = SessionConfig.coerce(config)
    keys = all_checkpoints(num_layers, router_layers)
    enabled = config.enabled_checkpoints
    if enabled is not None:
        names, specific = _named_keys(enabled, num_layers)
        keys = [k for k in keys if k.name in names or k in specific]
    elif available is not None:
        keys = [k for k in keys if k in available]
    if config.layers is not None:
        lo, hi = config.layers
        keys = [k for k in keys if k.layer is None or lo <= k.layer < hi]
    if not keys:
        raise ConfigurationError("no checkpoint is enabled", hint="check enabled_checkpoints and layers")
    return keys


def resolve_alternative_backend(name: str, reference: str) -> tuple[str, str]:
    """``(backend name, why)``. ``"auto"`` is the registry's choice
    (:func:`debug_framework.backends.registry.select_alternative`): the first available backend
    of its preference order that is not the reference."""
    if name != "auto":
        return name, "requested"
    from ...backends.registry import select_alternative

    chosen, why = select_alternative(reference)
    return str(chosen), str(why)


@dataclass(frozen=True)
class ValidationPlan:
    """What one validation will do, decided before any backend runs.

    Built once per run by :meth:`resolve` from the session's configuration and the model's layer
    count; every stage reads it, none re-derives it.
    """

    config: SessionConfig  #: the validated session configuration
    num_layers: int
    keys: tuple[CheckpointKey, ...]  #: the enabled checkpoints, model order
    reference_dtype: str
    alternative_dtype: str
    governing_dtype: str  #: the less precise of the two: it picks the default tolerances
    router_layers: tuple[int, ...] = ()  #: the mixture-of-experts layers (their ``router_logits`` checkpoints)
    #: each checkpoint's tolerance once resolved (one object per checkpoint, however many steps judge it)
    _tolerances: dict[CheckpointKey, Tolerance] = field(default_factory=dict, init=False, compare=False, repr=False)
    #: and whether the calibrated bound judges it (asked at every comparison of every decode step)
    _calibrated: dict[CheckpointKey, bool] = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def resolve(cls, config: SessionConfig | Mapping[str, object] | None, num_layers: int,
                router_layers: Sequence[int] = (), available: Collection[CheckpointKey] | None = None
                ) -> ValidationPlan:
        """The plan of a session with ``config`` (a :class:`SessionConfig` as it is; a mapping checked:
        ConfigurationError, DF005) on a model of ``num_layers`` layers (``router_layers``: its
        mixture-of-experts layers; ``available``: the checkpoints it declares, :func:`model_checkpoints`)."""
        cfg = SessionConfig.coerce(config)
        ref_dtype, alt_dtype = str(cfg.reference_dtype), str(cfg.dtype)
        routed = tuple(router_layers)
        return cls(config=cfg, num_layers=num_layers, keys=tuple(enabled_keys(cfg, num_layers, routed, available)),
                   reference_dtype=ref_dtype, alternative_dtype=alt_dtype,
                   governing_dtype=less_precise(ref_dtype, alt_dtype), router_layers=routed)

    @property
    def all_keys(self) -> list[CheckpointKey]:
        """Every checkpoint of the model (what isolation needs from each run), in model order."""
        return all_checkpoints(self.num_layers, self.router_layers)

    @property
    def thresholds(self) -> Mapping[str, JsonValue]:
        """The session's ``precision_thresholds``."""
        return self.config.precision_thresholds

    def tolerance(self, key: CheckpointKey) -> Tolerance:
        """The tolerance checkpoint ``key`` is judged by."""
        tol = self._tolerances.get(key)
        if tol is None:
            tol = self._tolerances[key] = resolve_tolerance(self.thresholds, key, self.governing_dtype)
        return tol

    def calibrated(self, key: CheckpointKey) -> bool:
        """Checkpoint ``key`` is judged by the calibrated bound (calibration on, no explicit
        tolerance for it in ``precision_thresholds``)."""
        got = self._calibrated.get(key)
        if got is None:
            got = self._calibrated[key] = bool(self.config.calibrate and not explicit_tolerance(self.thresholds, key))
        return got

    @property
    def eps(self) -> float:
        """Machine epsilon of the governing dtype (the unit of the scale-relative floors)."""
        return DTYPE_EPS.get(self.governing_dtype, DTYPE_EPS["float32"])

    @property
    def lower_precisions(self) -> tuple[str, ...]:
        """The compute dtypes less precise than the alternative's, most precise first (what the
        precision diagnosis measures correct runs at)."""
        if self.alternative_dtype not in _PRECISION_ORDER:
            return ()
        return _PRECISION_ORDER[_PRECISION_ORDER.index(self.alternative_dtype) + 1:]

    @property
    def layer_range(self) -> range:
        """The layers whose per-layer checkpoints (and isolation) this validation covers."""
        layers = self.config.layers
        if layers is None:
            return range(self.num_layers)
        return range(layers[0], min(layers[1], self.num_layers))

    @property
    def profiling(self) -> bool:
        """Performance profiling is on (wall times per backend and stage)."""
        return self.config.performance_profiling_enabled

    @property
    def per_layer_timing(self) -> bool:
        """Each layer's time is measured where the backend runs layers one by one."""
        return self.profiling and self.config.profile_execution_time

    @property
    def memory_profiling(self) -> bool:
        """Peak memory is measured around each forward pass."""
        return self.profiling and self.config.profile_memory_usage
