"""The session configuration is one frozen ``SessionConfig``: validated where it enters, read by
attribute, recorded with the session as JSON and read back from it (earlier stored configs too)."""

from __future__ import annotations

import dataclasses

import pytest

from debug_framework.errors import ConfigurationError
from debug_framework.models.session_config import SESSION_DEFAULTS, SessionConfig
from debug_framework.services.validation_engine import ValidationEngine


def test_values_are_checked_once_and_held_in_their_types():
    cfg = SessionConfig.from_mapping({"input_shape": [1, 8], "layers": [0, 2], "enabled_checkpoints": "post_mlp, "
                                      "post_attention:1", "decode_steps": 2, "decode_tokens": [[5, 6]],
                                      "oracle_multiplier": 3, "input_text": ["a", "b"]})
    assert cfg.input_shape == (1, 8) and cfg.layers == (0, 2) and cfg.decode_tokens == ((5, 6),)
    assert cfg.enabled_checkpoints == ("post_mlp", "post_attention:1")
    assert cfg.oracle_multiplier == 3.0 and isinstance(cfg.oracle_multiplier, float)
    assert cfg.input_text == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]
    assert SessionConfig.coerce(cfg) is cfg  # built once: not validated again


@pytest.mark.parametrize(("given", "message"), [
    ({"isolte": True}, "unknown session configuration key 'isolte'"),
    ({"isolate": "yes"}, "isolate must be true, false or 'auto'"),
    ({"seed": "zero"}, "seed must be an integer"),
    ({"alternative_options": ["a"]}, "alternative_options must be a mapping"),
    ({"noise_margin": -1}, "noise_margin must be a non-negative number"),
    ({"decode_tokens": [[1]]}, "decode_tokens given without decode_steps"),
])
def test_a_bad_value_is_df005_naming_it(given, message):
    with pytest.raises(ConfigurationError, match=message) as info:
        SessionConfig.from_mapping(given)
    assert info.value.code == "DF005"


def test_the_json_record_round_trips_and_earlier_records_load():
    cfg = SessionConfig.from_mapping({"isolate": True, "input_shape": [1, 8], "precision_thresholds": {"rtol": 1e-3},
                                      "alternative_options": {"providers": ["CPUExecutionProvider"]}})
    doc = cfg.to_json()
    assert set(doc) == set(SESSION_DEFAULTS) and doc["input_shape"] == [1, 8]
    assert SessionConfig.from_json(doc) == cfg
    # a record of an earlier version: fewer keys (defaults fill them) and one this version dropped
    old = {"isolate": "auto", "input_shape": [2, 16], "seed": 1, "a_key_of_an_older_version": 1}
    assert SessionConfig.from_json(old) == SessionConfig(seed=1)
    with pytest.raises(ConfigurationError):  # entering from a user, the same key is refused
        SessionConfig.from_mapping(old)
    assert cfg["isolate"] is True and cfg.get("input_shape") == [1, 8] and cfg.get("nope") is None


def test_the_session_records_its_config_as_json_and_runs_from_it(tiny_llama, db_path):
    engine = ValidationEngine(db_path)
    sid = engine.create_session(tiny_llama, SessionConfig(isolate=False, input_shape=(1, 8), seed=2),
                                "python_reference", "pytorch")
    stored = engine.db.sessions.get(sid)["config"]
    assert stored["input_shape"] == [1, 8] and stored["seed"] == 2 and stored["isolate"] is False
    assert stored["dtype"] == "float32" and stored["reference_dtype"] == "float64"  # resolved at creation
    again = SessionConfig.from_json(stored)
    assert again.input_shape == (1, 8) and again.dtype == "float32"
    assert ValidationEngine(db_path).run(sid).passed  # another engine: read back from the record
