"""The session configuration: one frozen :class:`SessionConfig`, validated once where it enters
(the CLI, a config file, the Python API, a batch item, a stored session read back) and read by
attribute everywhere after.

    cfg = SessionConfig.from_mapping({"isolate": True, "input_shape": [1, 8]})   # DF005 on a bad value
    cfg.isolate, cfg.input_shape                    # True, (1, 8)
    cfg.to_json()                                   # what the session records (every key, JSON lists)
    SessionConfig.from_json(row["config"])          # a stored session's, keys of older versions dropped

:data:`SESSION_DEFAULTS` is the default configuration as the JSON the session records.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from ..capture.keys import CheckpointKey
from ..comparison import FLOOR_EPS, NOISE_MARGIN
from ..errors import ConfigurationError
from ..jsonio import JsonObject, JsonValue, json_safe
from ..suggest import did_you_mean

__all__ = ["SessionConfig", "SESSION_DEFAULTS", "ORACLE_METRICS", "Isolate", "validate_session_config"]

#: ``isolate``: True (required), False (off) or ``"auto"`` (where both backends replay a layer).
Isolate: TypeAlias = bool | Literal["auto"]
#: The metrics the oracle and calibration ratio rules may compare errors by.
ORACLE_METRICS = ("rmse", "max_abs_error", "mean_abs_error", "rel_l2_error")
_NON_NEGATIVE = ("oracle_multiplier", "oracle_floor", "noise_margin", "floor_eps")
_STRICT_BOOLS = ("mark_all", "drill_down", "precision_diagnosis", "calibrate")
_LOOSE_BOOLS = ("tensor_recording_enabled", "performance_profiling_enabled", "profile_memory_usage",
                "profile_execution_time", "oracle", "noise_floor")


@dataclass(frozen=True)
class SessionConfig:
    """What one validation session is asked to do (docs/validation.md). Every field has its default;
    :meth:`from_mapping` checks the values (ConfigurationError, DF005)."""

    # the spec's keys
    #: None = all; names (``post_mlp``) and/or keys (``post_mlp:3``)
    enabled_checkpoints: tuple[str, ...] | None = None
    #: ``{"rtol", "atol", "pass_rule", ..., "<checkpoint>[:layer]": {...}}``
    precision_thresholds: Mapping[str, JsonValue] = field(default_factory=dict)
    tensor_recording_enabled: bool = False
    performance_profiling_enabled: bool = True
    profile_memory_usage: bool = False
    profile_execution_time: bool = True
    # the engine's own
    #: ``[start, stop)``: per-layer checkpoints of these layers only
    layers: tuple[int, int] | None = None
    #: True: required; "auto": where both backends support run_layer; False: off
    isolate: Isolate = "auto"
    oracle: bool = False
    oracle_multiplier: float = 2.0
    #: None: ``floor_eps x eps(dtype) x RMS(oracle tensor)``; a number: that absolute floor
    oracle_floor: float | None = None
    oracle_metric: str = "rmse"
    # calibrated judgement (docs/validation.md, "Calibrated tolerances")
    #: judge by the measured noise of a trusted run at the alternative's precision
    calibrate: bool = True
    #: "auto": torch_reference (the reference models through torch)
    calibration_backend: str = "auto"
    noise_margin: float = NOISE_MARGIN  #: bound = noise_margin x noise + floor
    floor_eps: float = FLOOR_EPS  #: floor = floor_eps x eps(dtype) x RMS(reference tensor)
    calibration_metric: str = "rmse"
    noise_floor: bool = False
    #: failed checkpoints: measure correct runs at lower precisions (consistent_with)
    precision_diagnosis: bool = True
    #: an ONNX-file model: every node output compared in topological order (mark_all.py)
    mark_all: bool = False
    #: name the operator that introduces error in each diverging layer (docs/drilldown.md)
    drill_down: bool = False
    seed: int = 0
    input_text: str | tuple[str, ...] | None = None  #: needs the model's tokenizer
    max_length: int | None = None
    #: ``[batch, length]`` of seeded random token ids when no text is given
    input_shape: tuple[int, int] = (2, 16)
    #: "generic": the model's own eager code even where a from-the-math reference exists
    model_tier: str = "auto"
    #: a .safetensors file of named inputs (any model: pixel_values, decoder_input_ids ...)
    inputs_file: str | None = None
    #: random inputs: padding per row (default: the second row a quarter padded)
    pad_lengths: tuple[int, ...] | None = None
    padding_side: str = "right"  #: "left": shorter rows padded at the start (random and text inputs)
    position_offset: int = 0  #: the first token's position (a sequence continued from there)
    decode_steps: int = 0  #: after the prefill, this many tokens decoded through each backend's KV cache
    #: ``[batch][steps]`` token ids fed at the decode steps (default: the reference's greedy)
    decode_tokens: tuple[tuple[int, ...], ...] | None = None
    dtype: str | None = None  #: the alternative's compute dtype (default: the backend's)
    #: set at ``dtype: "auto"`` where the alternative declares a precision beyond a float dtype (an
    #: engine's emulated precision, e.g. llama.cpp's ``q8_0``): the calibration reproduces it
    emulated_precision: str | None = None
    #: default: float64 for python_reference; the alternative's in oracle mode
    reference_dtype: str | None = None
    device: str = "cpu"  #: the alternative's device
    reference_device: str = "cpu"
    reference_options: Mapping[str, object] = field(default_factory=dict)  #: keywords of get_backend(reference, ...)
    alternative_options: Mapping[str, object] = field(default_factory=dict)
    tensor_recording_limit: int | None = None  #: default: the framework config's
    tensor_recording_byte_budget: int | None = None

    # ------------------------------------------------------------------ entering

    @classmethod
    def from_mapping(cls, config: Mapping[str, object] | None) -> SessionConfig:
        """The defaults overlaid with ``config`` (the keys of :data:`SESSION_DEFAULTS`), every value
        checked: an unknown key or a bad value is ConfigurationError (DF005)."""
        given = dict(config or {})
        for key in given:
            if key not in _FIELDS:
                raise ConfigurationError(
                    f"unknown session configuration key {key!r}" + did_you_mean(key, _FIELDS),
                    hint=f"known keys: {', '.join(_FIELDS)}",
                )
        values = {key: copy.deepcopy(value) for key, value in given.items()}
        _check(values)
        return cls(**_normalized(values))

    @classmethod
    def coerce(cls, config: SessionConfig | Mapping[str, object] | None) -> SessionConfig:
        """``config`` as it is where it already is one (validated when it was built), else
        :meth:`from_mapping`."""
        return config if isinstance(config, SessionConfig) else cls.from_mapping(config)

    @classmethod
    def from_json(cls, stored: Mapping[str, object] | None) -> SessionConfig:
        """A stored session's configuration (:meth:`to_json`, or the dict earlier versions stored):
        keys this version no longer knows are dropped, the rest checked as :meth:`from_mapping`."""
        return cls.from_mapping({k: v for k, v in (stored or {}).items() if k in _FIELDS})

    def replace(self, **changes: object) -> SessionConfig:
        """A copy with ``changes`` (checked as :meth:`from_mapping`)."""
        return SessionConfig.from_mapping({**self.to_mapping(), **changes})

    # ------------------------------------------------------------------ leaving

    def to_mapping(self) -> dict[str, object]:
        """Every key and its value as held (tuples, option values as given)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json(self) -> JsonObject:
        """What the session records: every key, sequences as JSON lists (the dict of earlier
        versions, so stored sessions read the same)."""
        return {key: _jsonable(value) for key, value in self.to_mapping().items()}

    def __getitem__(self, key: str) -> JsonValue:
        """``config["key"]``: the key's value as :meth:`to_json` records it, for stages written
        against the dict this configuration was."""
        if key not in _FIELDS:
            raise KeyError(key)
        return _jsonable(getattr(self, key))

    def get(self, key: str, default: JsonValue = None) -> JsonValue:
        """``config.get("key")``: as ``config["key"]``, ``default`` for a key that is not one."""
        return self[key] if key in _FIELDS else default


def _jsonable(value: object) -> JsonValue:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    return json_safe(value)


def _nonneg_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check(v: Mapping[str, object]) -> None:
    """Each given value checked (ConfigurationError, DF005); missing keys keep their defaults."""
    isolate = v.get("isolate", "auto")
    if isolate not in (True, False, "auto"):
        raise ConfigurationError(f"isolate must be true, false or 'auto', got {isolate!r}")
    for key in ("oracle_metric", "calibration_metric"):
        if v.get(key, "rmse") not in ORACLE_METRICS:
            raise ConfigurationError(f"{key} must be one of {', '.join(ORACLE_METRICS)}")
    for key in _NON_NEGATIVE:
        x = v.get(key, 0.0)
        if key == "oracle_floor" and x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0:
            raise ConfigurationError(f"{key} must be a non-negative number, got {x!r}")
    limit = v.get("tensor_recording_limit")
    if limit is not None and not _nonneg_int(limit):
        raise ConfigurationError(f"tensor_recording_limit must be a non-negative integer or null, got {limit!r}",
                                 key="tensor_recording_limit")
    for key in _STRICT_BOOLS:
        if not isinstance(v.get(key, False), bool):
            raise ConfigurationError(f"{key} must be true or false, got {v[key]!r}")
    emulated = v.get("emulated_precision")
    if emulated is not None and (not isinstance(emulated, str) or not emulated):
        raise ConfigurationError(f"emulated_precision must be a precision's name or null, got {emulated!r}")
    backend = v.get("calibration_backend", "auto")
    if not isinstance(backend, str) or not backend:
        raise ConfigurationError("calibration_backend must be a backend name or 'auto'")
    if not isinstance(v.get("precision_thresholds", {}), Mapping):
        raise ConfigurationError("precision_thresholds must be a mapping like {'rtol': 1e-4, 'atol': 1e-5}")
    for key in ("reference_options", "alternative_options"):
        if not isinstance(v.get(key) or {}, Mapping):
            raise ConfigurationError(f"{key} must be a mapping of the backend's keyword arguments, got {v[key]!r}")
    _check_inputs(v)


def _check_inputs(v: Mapping[str, object]) -> None:
    """The keys that say what the model is given (inputs, positions, decode steps, layers)."""
    if v.get("model_tier", "auto") not in ("auto", "generic"):
        raise ConfigurationError(f"model_tier must be 'auto' or 'generic', got {v['model_tier']!r}")
    if v.get("inputs_file") is not None and not isinstance(v["inputs_file"], str):
        raise ConfigurationError(f"inputs_file must be a path, got {v['inputs_file']!r}")
    shape = v.get("input_shape", [2, 16])
    if not (isinstance(shape, Sequence) and len(shape) == 2 and all(isinstance(x, int) and x > 0 for x in shape)):
        raise ConfigurationError(f"input_shape must be [batch, length] of positive ints, got {shape!r}")
    if v.get("padding_side", "right") not in ("right", "left"):
        raise ConfigurationError(f"padding_side must be 'right' or 'left', got {v['padding_side']!r}")
    if not _nonneg_int(v.get("position_offset", 0)):
        raise ConfigurationError(f"position_offset must be an int >= 0, got {v['position_offset']!r}")
    steps = v.get("decode_steps", 0)
    if not _nonneg_int(steps):
        raise ConfigurationError(f"decode_steps must be an int >= 0, got {steps!r}")
    if v.get("decode_tokens") is not None and not steps:
        raise ConfigurationError("decode_tokens given without decode_steps", hint="set decode_steps to their number")
    lo_hi = v.get("layers")
    if lo_hi is not None and not (
            isinstance(lo_hi, Sequence) and not isinstance(lo_hi, str) and len(lo_hi) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in lo_hi) and 0 <= lo_hi[0] <= lo_hi[1]):
        raise ConfigurationError(f"layers must be [start, stop) with 0 <= start <= stop, got {lo_hi!r}")
    seed = v.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigurationError(f"seed must be an integer, got {seed!r}")


def _checkpoint_names(enabled: object) -> tuple[str, ...]:
    """``enabled_checkpoints`` as names (``post_mlp``) and keys (``post_mlp:3``): a comma-separated
    string split, a ``(name, layer)`` pair, a :class:`CheckpointKey` or its JSON form written as its key."""
    items: Sequence[object] = [e for e in enabled.split(",")] if isinstance(enabled, str) else \
        list(enabled) if isinstance(enabled, Sequence) else [enabled]
    names: list[str] = []
    for item in items:
        if isinstance(item, str):
            if item.strip():
                names.append(item.strip())
        elif isinstance(item, (CheckpointKey, tuple, list, Mapping)):
            names.append(str(CheckpointKey.parse(tuple(item) if isinstance(item, list) else item)))  # type: ignore[arg-type]
        else:
            names.append(str(item).strip())
    return tuple(names)


def _int_tuple(value: object) -> tuple[int, ...]:
    return tuple(int(x) for x in value)  # type: ignore[attr-defined]  # checked a sequence of ints


def _normalized(v: dict[str, object]) -> dict[str, object]:
    """The checked values in the fields' types: sequences as tuples, numbers as floats, flags as bools."""
    if v.get("enabled_checkpoints") is not None:
        v["enabled_checkpoints"] = _checkpoint_names(v["enabled_checkpoints"])
    for key in ("layers", "input_shape", "pad_lengths"):
        if v.get(key) is not None:
            v[key] = _int_tuple(v[key])
    if v.get("decode_tokens") is not None:
        v["decode_tokens"] = tuple(_int_tuple(row) for row in v["decode_tokens"])  # type: ignore[attr-defined]
    text = v.get("input_text")
    if text is not None and not isinstance(text, str):
        v["input_text"] = tuple(str(t) for t in text)  # type: ignore[attr-defined]
    for key in _NON_NEGATIVE:
        if v.get(key) is not None:
            v[key] = float(v[key])  # type: ignore[arg-type]  # checked a number
    for key in _LOOSE_BOOLS:
        if key in v:
            v[key] = bool(v[key])
    for key in ("reference_options", "alternative_options", "precision_thresholds"):
        if key in v:
            v[key] = dict(v[key] or {})  # type: ignore[call-overload]  # checked a mapping
    for key in ("dtype", "reference_dtype"):
        if v.get(key) is not None:
            v[key] = str(v[key])
    return v


_FIELDS: dict[str, None] = {f.name: None for f in dataclasses.fields(SessionConfig)}

#: Session configuration keys and their defaults, as the session records them (see docs/validation.md).
SESSION_DEFAULTS: JsonObject = SessionConfig().to_json()


def validate_session_config(config: Mapping[str, object] | None) -> JsonObject:
    """``SESSION_DEFAULTS`` overlaid with ``config``, every value checked (ConfigurationError,
    DF005), as the JSON a session records: :meth:`SessionConfig.from_mapping` then ``to_json()``."""
    return SessionConfig.from_mapping(config).to_json()
