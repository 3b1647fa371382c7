"""``--config-file`` of debug_validate and debug_batch is read strictly (issue 33, item 2): a special
file, an oversized, non-UTF-8, non-finite, deeply nested or out-of-range file is DF005 naming the file
and the field, exit 2, read with bounded memory; a property test over config files never exits 3 or hangs."""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from debug_framework.cli import debug_batch, debug_validate
from debug_framework.errors import ConfigurationError
from debug_framework.jsonio import read_json_object
from debug_framework.safefiles import MAX_CONFIG_BYTES, MAX_JSON_DEPTH


def _validate(tmp_path, config) -> int:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)  # exists: the config file is read before the heavy imports
    return debug_validate.run(["--model-path", str(model), "--config-file", str(config),
                               "--database", str(tmp_path / "s.db")])


CASES = {
    "nan": ('{"noise_margin": NaN}', "noise_margin"),
    "-infinity limit": ('{"tensor_recording_limit": -Infinity}', "tensor_recording_limit"),
    "5000 digits": ('{"tensor_recording_limit": ' + "9" * 5000 + "}", "tensor_recording_limit"),
    "2**64": ('{"seed": 18446744073709551616}', "seed"),
    "float overflow": ('{"precision_thresholds": {"rtol": 1e999}}', "precision_thresholds.rtol"),
    "too deep": ('{"a": ' + "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5) + "}", None),
    "100000 deep": ("[" * 100_000 + "]" * 100_000, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_strict_values_name_the_field(tmp_path, capsys, case):
    text, field = CASES[case]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(text)
    with pytest.raises(ConfigurationError) as info:
        read_json_object(cfg, "config file")
    if field is not None:
        assert info.value.context["field"] == field
    assert _validate(tmp_path, cfg) == 2
    err = capsys.readouterr().err
    assert "[DF005]" in err and str(cfg) in err and "internal error" not in err


def test_size_cap_is_said_and_memory_bounded(tmp_path, capsys):
    cfg = tmp_path / "big.json"
    with open(cfg, "wb") as fh:  # a sparse 1 GB file: reading it whole would take gigabytes
        fh.truncate(1 << 30)
    assert _validate(tmp_path, cfg) == 2
    assert "larger than 1 MiB" in capsys.readouterr().err
    assert MAX_CONFIG_BYTES == 1 << 20


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_special_files_refused_without_reading(tmp_path, capsys, special):
    path = tmp_path / "fifo" if special == "fifo" else special
    if special == "fifo":
        os.mkfifo(path)
    start = time.monotonic()
    assert _validate(tmp_path, path) == 2
    listing = tmp_path / "models.txt"
    listing.write_text(str(tmp_path / "m") + "\n")
    assert debug_batch.main([str(listing), "--config-file", str(path), "--database", str(tmp_path / "b.db")]) == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and time.monotonic() - start < 10


def test_debug_batch_config_file(tmp_path, capsys):
    listing = tmp_path / "models.txt"
    (tmp_path / "m").mkdir()  # the model paths are checked first: this one exists
    listing.write_text(str(tmp_path / "m") + "\n")
    cfg = tmp_path / "c.json"
    cfg.write_bytes(b'{"isolate": "\xff"}')
    assert debug_batch.main([str(listing), "--config-file", str(cfg), "--database", str(tmp_path / "b.db")]) == 2
    err = capsys.readouterr().err
    assert "[DF005]" in err and "not UTF-8" in err


def test_negative_infinity_limit_refused_by_the_session_check():
    from debug_framework.services.validation.plan import validate_session_config

    for bad in (float("-inf"), -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="tensor_recording_limit"):
            validate_session_config({"tensor_recording_limit": bad})
    assert validate_session_config({"tensor_recording_limit": 0})["tensor_recording_limit"] == 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
_KEYS = ["tensor_recording_limit", "noise_margin", "isolate", "layers", "input_shape", "precision_thresholds",
         "enabled_checkpoints", "seed", "oracle_floor", "drill_down"]


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.one_of(st.binary(max_size=48), st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=3),
                      _JSON))
def test_property_any_config_file_exits_0_1_or_2(tmp_path_factory, capsys, data):
    tmp = tmp_path_factory.mktemp("cfg")
    cfg = tmp / "c.json"
    cfg.write_bytes(data if isinstance(data, bytes) else json.dumps(data, allow_nan=True).encode())
    start = time.monotonic()
    rc = _validate(tmp, cfg)  # the model folder is empty: a config that passes ends at DF004
    err = capsys.readouterr().err
    assert rc in (0, 1, 2) and "internal error" not in err, err
    assert time.monotonic() - start < 30
