"""Plugin manifests are read strictly (issue 33, item 3): every malformed or hostile manifest is
DF008 naming the file or the field, exit 2 from plugin_compile, never an internal error (3) or a hang."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from debug_framework.cli import plugin_compile
from debug_framework.errors import PluginCompilationError
from debug_framework.plugins.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
CPP = json.loads((EXAMPLES / "cpp" / "plugin.json").read_text())


@pytest.fixture
def plugin_dir(tmp_path):
    """A copy of the C++ example's folder (its sources and reference) to write manifests into."""
    folder = tmp_path / "plugin"
    shutil.copytree(EXAMPLES / "cpp", folder)
    return folder


def _with(**changes):
    data = json.loads(json.dumps(CPP))
    for key, value in changes.items():
        if key.startswith("k1_"):
            data["kernels"][1][key[3:]] = value
        else:
            data[key] = value
    return data


def _raw_cases():
    deep = "[" * 100_000 + "]" * 100_000
    valid = json.dumps(CPP)
    return {
        "latin-1": valid.replace("C++", "C\xe9").encode("latin-1"),
        "utf-16": valid.encode("utf-16"),
        "deep": deep.encode(),
        "big int": valid.replace('"1.0.0"', "1" + "0" * 100_000).encode(),
        "nan": valid.replace("1e-06", "NaN").encode(),
        "overflow": valid.replace("1e-06", "1e999").encode(),
        "too large": b" " * (2 << 20) + valid.encode(),
    }


@pytest.mark.parametrize("case", list(_raw_cases()))
def test_malformed_files_are_df008(plugin_dir, case):
    manifest = plugin_dir / "plugin.json"
    manifest.write_bytes(_raw_cases()[case])
    with pytest.raises(PluginCompilationError) as info:
        load_manifest(manifest)
    assert info.value.context["file"] == str(manifest)


@pytest.mark.parametrize("change, field", [
    ({"sources": ["kernels.cpp\x00"]}, "sources[0]"),
    ({"sources": [5]}, "sources[0]"),
    ({"kernels": []}, "kernels"),
    ({"id": "example-cpp\n"}, "id"),
    ({"k1_name": "rms_norm\n"}, "kernels[1].name"),
    ({"k1_entry": "df_example::rms_norm\n"}, "kernels[1].entry"),
    ({"k1_op": "df_example::rms_norm(Tensor x, Tensor w, float eps) -> Tensor\n"}, "kernels[1].op"),
    ({"k1_dtypes": 5}, "kernels[1].dtypes"),
    ({"k1_args": {"eps": "abc"}}, "kernels[1].args.eps"),
    ({"k1_args": {"nope": 1.0}}, "kernels[1].args.nope"),
    ({"k1_args": {"x": 1.0}}, "kernels[1].args.x"),
    ({"k1_inputs": {"x\n": "...,D", "w": "D"}}, "kernels[1].inputs"),
    ({"version": True}, "version"),
    ({"description": ["x"]}, "description"),
])
def test_bad_fields_are_refused_naming_them(plugin_dir, change, field):
    (plugin_dir / "plugin.json").write_text(json.dumps(_with(**change)))
    with pytest.raises(PluginCompilationError) as info:
        load_manifest(plugin_dir)
    assert info.value.context["field"] == field


def test_special_files_are_refused(tmp_path):
    fifo = tmp_path / "plugin.json"
    os.mkfifo(fifo)
    with pytest.raises(PluginCompilationError, match="FIFO"):
        load_manifest(fifo)
    with pytest.raises(PluginCompilationError, match="character device"):
        load_manifest("/dev/zero")


def test_the_valid_example_still_loads():
    defn = load_manifest(EXAMPLES / "cpp")
    assert [k.name for k in defn.kernels] == ["gelu", "rms_norm"] and defn.kernels[1].args == {"eps": 1e-6}


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
_FIELDS = ["id", "version", "backend", "sources", "kernels", "description", "k1_name", "k1_op", "k1_entry",
           "k1_dtypes", "k1_args", "k1_inputs", "k1_reference", "k1_devices", "k1_swap_module"]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.one_of(
    st.binary(max_size=64),
    st.tuples(st.sampled_from(_FIELDS), _JSON),
    _JSON.map(lambda v: json.dumps(v, allow_nan=True).encode())))
def test_property_any_manifest_exits_0_1_or_2(tmp_path_factory, capsys, data):
    folder = tmp_path_factory.mktemp("prop")
    shutil.copy(EXAMPLES / "metal" / "gelu.metal", folder)
    if isinstance(data, tuple):  # a valid Metal manifest (no toolchain here: DF008) with one field replaced
        base = json.loads((EXAMPLES / "metal" / "plugin.json").read_text())
        field, value = data
        if field.startswith("k1_"):
            base["kernels"][0][field[3:]] = value
        else:
            base[field] = value
        raw = json.dumps(base, allow_nan=True).encode()
    else:
        raw = data
    (folder / "plugin.json").write_bytes(raw)
    start = time.monotonic()
    rc = plugin_compile.main(["--plugin-path", str(folder), "--database", str(folder / "r.db"),
                              "--cache-dir", str(folder / "cache")])
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), err
    assert "internal error" not in err
    assert time.monotonic() - start < 20


def test_tour_knob_op_names_are_anchored():
    from debug_framework.errors import ConfigurationError
    from debug_module.demo.knobs import TourKnobs

    assert TourKnobs(fail_op="aten.tanh.default").fail_op == "aten.tanh.default"
    with pytest.raises(ConfigurationError):
        TourKnobs(fail_op="aten.tanh.default\n")
