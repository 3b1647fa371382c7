"""The validation plan: a session's configuration resolved once (defaults, checks, dtypes,
checkpoint keys, tolerances) so the stages read decisions instead of re-deriving them."""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...capture.keys import PER_LAYER_CHECKPOINTS, CheckpointKey, all_checkpoints
from ...comparison import FLOOR_EPS, NOISE_MARGIN, Tolerance
from ...errors import ConfigurationError
from ...suggest import did_you_mean

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
    "oracle_floor": None,  # None: floor_eps x eps(dtype) x RMS(oracle tensor); a number: that absolute floor
    "oracle_metric": "rmse",
    # calibrated judgement (docs/validation.md, "Calibrated tolerances")
    "calibrate": True,  # judge by the measured noise of a trusted run at the alternative's precision
    "calibration_backend": "auto",  # "auto": torch_reference (the reference models through torch)
    "noise_margin": NOISE_MARGIN,  # 4.0; bound = noise_margin x noise + floor
    "floor_eps": FLOOR_EPS,  # 1.0; floor = floor_eps x eps(dtype) x RMS(reference tensor)
    "calibration_metric": "rmse",
    "noise_floor": False,
    "precision_diagnosis": True,  # failed checkpoints: measure correct runs at lower precisions (consistent_with)
    "mark_all": False,  # an ONNX-file model: every node output compared in topological order (mark_all.py)
    "drill_down": False,  # name the operator that introduces error in each diverging layer (docs/drilldown.md)
    "seed": 0,
    "input_text": None,  # str or list of str (needs the model's tokenizer)
    "max_length": None,
    "input_shape": [2, 16],  # [batch, length] of seeded random token ids when no text is given
    "model_tier": "auto",  # "generic": the model's own eager code even where a from-the-math reference exists
    "inputs_file": None,  # a .safetensors file of named inputs (any model: pixel_values, decoder_input_ids ...)
    "pad_lengths": None,  # random inputs: padding per row (default: the second row a quarter padded)
    "padding_side": "right",  # "left": shorter rows padded at the start (random and text inputs)
    "position_offset": 0,  # the first token's position (a sequence continued from there)
    "decode_steps": 0,  # after the prefill, this many tokens decoded through each backend's KV cache
    "decode_tokens": None,  # [batch][steps] token ids fed at the decode steps (default: the reference's greedy)
    "dtype": None,  # the alternative's compute dtype (default: the backend's)
    "reference_dtype": None,  # default: float64 for python_reference; the alternative's in oracle mode
    "device": "cpu",  # the alternative's device
    "reference_device": "cpu",
    "reference_options": {},  # keyword arguments of get_backend(reference, ...)
    "alternative_options": {},
    "tensor_recording_limit": None,  # default: the framework config's
    "tensor_recording_byte_budget": None,
}

ORACLE_METRICS = ("rmse", "max_abs_error", "mean_abs_error", "rel_l2_error")
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
DTYPE_EPS: dict[str, float] = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def explicit_tolerance(thresholds: Mapping[str, Any] | None, key: CheckpointKey) -> bool:
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
            raise ConfigurationError(
                f"unknown tolerance field(s) {sorted(unknown)} for checkpoint {key}",
                hint=f"use {', '.join(_TOL_FIELDS)}",
            )
        tol = tol.with_overrides(**layer)
    return tol


def validate_session_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``SESSION_DEFAULTS`` overlaid with ``config``, every value checked (ConfigurationError, DF005)."""
    merged = copy.deepcopy(SESSION_DEFAULTS)
    for key, value in (config or {}).items():
        if key not in SESSION_DEFAULTS:
            raise ConfigurationError(
                f"unknown session configuration key {key!r}" + did_you_mean(key, SESSION_DEFAULTS),
                hint=f"known keys: {', '.join(SESSION_DEFAULTS)}",
            )
        merged[key] = copy.deepcopy(value)
    if merged["isolate"] not in (True, False, "auto"):
        raise ConfigurationError(f"isolate must be true, false or 'auto', got {merged['isolate']!r}")
    if not isinstance(merged["mark_all"], bool):
        raise ConfigurationError(f"mark_all must be true or false, got {merged['mark_all']!r}")
    if merged["oracle_metric"] not in ORACLE_METRICS:
        raise ConfigurationError(f"oracle_metric must be one of {', '.join(ORACLE_METRICS)}")
    for key in ("oracle_multiplier", "oracle_floor", "noise_margin", "floor_eps"):
        v = merged[key]
        if key == "oracle_floor" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ConfigurationError(f"{key} must be a non-negative number, got {v!r}")
    limit = merged["tensor_recording_limit"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigurationError(f"tensor_recording_limit must be a non-negative integer or null, got {limit!r}",
                                 key="tensor_recording_limit")
    if merged["calibration_metric"] not in ORACLE_METRICS:
        raise ConfigurationError(f"calibration_metric must be one of {', '.join(ORACLE_METRICS)}")
    if not isinstance(merged["drill_down"], bool):
        raise ConfigurationError(f"drill_down must be true or false, got {merged['drill_down']!r}")
    if not isinstance(merged["precision_diagnosis"], bool):
        raise ConfigurationError(f"precision_diagnosis must be true or false, got {merged['precision_diagnosis']!r}")
    if not isinstance(merged["calibrate"], bool):
        raise ConfigurationError(f"calibrate must be true or false, got {merged['calibrate']!r}")
    if not isinstance(merged["calibration_backend"], str) or not merged["calibration_backend"]:
        raise ConfigurationError("calibration_backend must be a backend name or 'auto'")
    if not isinstance(merged["precision_thresholds"], Mapping):
        raise ConfigurationError("precision_thresholds must be a mapping like {'rtol': 1e-4, 'atol': 1e-5}")
    if merged["model_tier"] not in ("auto", "generic"):
        raise ConfigurationError(f"model_tier must be 'auto' or 'generic', got {merged['model_tier']!r}")
    if merged["inputs_file"] is not None and not isinstance(merged["inputs_file"], str):
        raise ConfigurationError(f"inputs_file must be a path, got {merged['inputs_file']!r}")
    shape = merged["input_shape"]
    if not (isinstance(shape, Sequence) and len(shape) == 2 and all(isinstance(v, int) and v > 0 for v in shape)):
        raise ConfigurationError(f"input_shape must be [batch, length] of positive ints, got {shape!r}")
    if merged["padding_side"] not in ("right", "left"):
        raise ConfigurationError(f"padding_side must be 'right' or 'left', got {merged['padding_side']!r}")
    offset = merged["position_offset"]
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigurationError(f"position_offset must be an int >= 0, got {offset!r}")
    steps = merged["decode_steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigurationError(f"decode_steps must be an int >= 0, got {steps!r}")
    if merged["decode_tokens"] is not None and not steps:
        raise ConfigurationError("decode_tokens given without decode_steps", hint="set decode_steps to their number")
    if merged["layers"] is not None:
        lo_hi = merged["layers"]
        if not (isinstance(lo_hi, Sequence) and not isinstance(lo_hi, str) and len(lo_hi) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in lo_hi) and 0 <= lo_hi[0] <= lo_hi[1]):
            raise ConfigurationError(f"layers must be [start, stop) with 0 <= start <= stop, got {lo_hi!r}")
    return merged


def _named_keys(enabled: Sequence[Any] | str, num_layers: int) -> tuple[set[str], set[CheckpointKey]]:
    """Split ``enabled_checkpoints`` into whole names (``post_mlp``) and specific keys (``post_mlp:3``)."""
    if isinstance(enabled, str):
        enabled = [e for e in enabled.split(",") if e.strip()]
    names: set[str] = set()
    specific: set[CheckpointKey] = set()
    for item in enabled:
        text = str(item).strip() if not isinstance(item, (tuple, Mapping, CheckpointKey)) else item
        if isinstance(text, str) and ":" not in text:
            CheckpointKey(text, 0 if text in PER_LAYER_CHECKPOINTS else None).validate()
            names.add(text)
            continue
        k = CheckpointKey.parse(text)
        if k.layer is not None and k.layer >= num_layers:
            raise ConfigurationError(f"checkpoint {k} is beyond the model's {num_layers} layers", checkpoint=str(k))
        specific.add(k)
    return names, specific


def model_checkpoints(model: Any) -> frozenset[CheckpointKey] | None:
    """The checkpoints a model declares it has (an ONNX file's: the boundaries found in its graph,
    ``config.checkpoint_tensors``), or None where every checkpoint of its layers exists."""
    found = getattr(getattr(model, "config", None), "checkpoint_tensors", None)
    return None if found is None else frozenset(CheckpointKey.parse(k) for k in found)


def enabled_keys(config: Mapping[str, Any], num_layers: int, router_layers: Sequence[int] = (),
                 available: Collection[CheckpointKey] | None = None) -> list[CheckpointKey]:
    """The enabled checkpoints in model order (``router_layers``: the layers whose router logits
    exist). By default every checkpoint, those of ``available`` only where the model declares what
    it has (a graph without a ``post_attention`` boundary: none asked for); checkpoints named in
    ``enabled_checkpoints`` are asked for as named (one the model lacks is reported missing)."""
    keys = all_checkpoints(num_layers, router_layers)
    enabled = config.get("enabled_checkpoints")
    if enabled is not None:
        names, specific = _named_keys(enabled, num_layers)
        keys = [k for k in keys if k.name in names or k in specific]
    elif available is not None:
        keys = [k for k in keys if k in available]
    layers = config.get("layers")
    if layers is not None:
        lo, hi = int(layers[0]), int(layers[1])
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

    Built by :meth:`resolve` from a stored session's configuration and the model's layer count;
    every stage reads it, none re-derives it.
    """

    config: Mapping[str, Any]  #: the validated session configuration (``SESSION_DEFAULTS`` keys)
    num_layers: int
    keys: tuple[CheckpointKey, ...]  #: the enabled checkpoints, model order
    reference_dtype: str
    alternative_dtype: str
    governing_dtype: str  #: the less precise of the two: it picks the default tolerances
    router_layers: tuple[int, ...] = ()  #: the mixture-of-experts layers (their ``router_logits`` checkpoints)

    @classmethod
    def resolve(cls, config: Mapping[str, Any] | None, num_layers: int,
                router_layers: Sequence[int] = (), available: Collection[CheckpointKey] | None = None
                ) -> ValidationPlan:
        """The plan of a session with ``config`` (checked: ConfigurationError, DF005) on a model of
        ``num_layers`` layers (``router_layers``: its mixture-of-experts layers; ``available``: the
        checkpoints it declares, :func:`model_checkpoints`)."""
        cfg = validate_session_config(config)
        ref_dtype, alt_dtype = str(cfg["reference_dtype"]), str(cfg["dtype"])
        routed = tuple(router_layers)
        return cls(config=cfg, num_layers=num_layers, keys=tuple(enabled_keys(cfg, num_layers, routed, available)),
                   reference_dtype=ref_dtype, alternative_dtype=alt_dtype,
                   governing_dtype=less_precise(ref_dtype, alt_dtype), router_layers=routed)

    @property
    def all_keys(self) -> list[CheckpointKey]:
        """Every checkpoint of the model (what isolation needs from each run), in model order."""
        return all_checkpoints(self.num_layers, self.router_layers)

    @property
    def thresholds(self) -> Mapping[str, Any]:
        """The session's ``precision_thresholds``."""
        return self.config["precision_thresholds"]

    def tolerance(self, key: CheckpointKey) -> Tolerance:
        """The tolerance checkpoint ``key`` is judged by."""
        return resolve_tolerance(self.thresholds, key, self.governing_dtype)

    def calibrated(self, key: CheckpointKey) -> bool:
        """Checkpoint ``key`` is judged by the calibrated bound (calibration on, no explicit
        tolerance for it in ``precision_thresholds``)."""
        return bool(self.config["calibrate"]) and not explicit_tolerance(self.thresholds, key)

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
        layers = self.config["layers"]
        if layers is None:
            return range(self.num_layers)
        return range(int(layers[0]), min(int(layers[1]), self.num_layers))

    @property
    def profiling(self) -> bool:
        """Performance profiling is on (wall times per backend and stage)."""
        return bool(self.config["performance_profiling_enabled"])

    @property
    def per_layer_timing(self) -> bool:
        """Each layer's time is measured where the backend runs layers one by one."""
        return self.profiling and bool(self.config["profile_execution_time"])

    @property
    def memory_profiling(self) -> bool:
        """Peak memory is measured around each forward pass."""
        return self.profiling and bool(self.config["profile_memory_usage"])
