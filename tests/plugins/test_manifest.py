"""The plugin manifest: parsed into a definition; every mistake is DF008 naming the field."""

from __future__ import annotations

import json

import pytest

from debug_framework.errors import PluginCompilationError
from debug_framework.plugins.manifest import PluginDefinition, load_manifest, parse_manifest

from .conftest import EXAMPLES

GOOD = {"id": "p", "version": "1", "backend": "cpp", "sources": ["k.cpp"],
        "kernels": [{"name": "rms", "op": "ns::rms(Tensor x, Tensor w, float eps) -> Tensor", "entry": "ns::rms",
                     "reference": "ref.py:rms", "inputs": {"x": "...,D", "w": "D"}, "args": {"eps": 1e-6}}]}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "k.cpp").write_text("// kernel\n")
    (tmp_path / "ref.py").write_text("def rms(x, w, eps):\n    return x\n")
    return tmp_path


def _parse(folder, **changes):
    data = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if key.startswith("k_"):
            data["kernels"][0][key[2:]] = value
        else:
            data[key] = value
    return parse_manifest(data, folder / "plugin.json")


def test_examples_parse_and_round_trip():
    for name in ("cpp", "cpp_buggy", "triton", "cuda", "metal"):
        defn = load_manifest(EXAMPLES / name)
        assert PluginDefinition.from_dict(json.loads(json.dumps(defn.to_dict()))) == defn
    cpp = load_manifest(EXAMPLES / "cpp" / "plugin.json")
    assert [k.name for k in cpp.kernels] == ["gelu", "rms_norm"]
    assert cpp.kernel("gelu").is_aten and not cpp.kernel("rms_norm").is_aten
    assert cpp.kernel("rms_norm").swap_module.cls == "LlamaRMSNorm"


@pytest.mark.parametrize("changes, field, words", [
    ({"colour": "red"}, "colour", "unknown field"),
    ({"k_shape": 1}, "kernels[0].shape", "unknown field"),
    ({"backend": "opencl"}, "backend", "not one of"),
    ({"sources": ["missing.cpp"]}, "sources[0]", "does not exist"),
    ({"sources": ["../k.cpp"]}, "sources[0]", "leaves the plugin"),
    ({"sources": ["ref.py"]}, "sources[0]", "not a cpp source"),
    ({"k_op": "ns::rms(Tensor x, Wat w) -> Tensor"}, "kernels[0].op", "not a valid operator schema"),
    ({"k_op": "gelu"}, "kernels[0].op", "ATen op"),
    ({"k_reference": None}, "kernels[0].reference", "required for a custom op"),
    ({"k_entry": "rms"}, "kernels[0].entry", "ns::name"),
    ({"k_dtypes": ["float8"]}, "kernels[0].dtypes", "unknown dtype"),
    ({"id": "no spaces"}, "id", "letters"),
    ({"k_devices": "cuda"}, "kernels[0].devices", "non-empty list"),
    ({"k_devices": ["tpu"]}, "kernels[0].devices", "non-empty list"),
    ({"k_opinfo": 3}, "kernels[0].opinfo", "OpInfo"),
])
def test_mistakes_are_df008_naming_the_field(folder, changes, field, words):
    with pytest.raises(PluginCompilationError) as info:
        _parse(folder, **changes)
    assert info.value.code == "DF008"
    assert info.value.context["field"] == field
    assert words in info.value.message


def test_unreadable_or_non_json_manifest(tmp_path):
    with pytest.raises(PluginCompilationError, match="cannot read the plugin manifest"):
        load_manifest(tmp_path / "nope.json")
    (tmp_path / "plugin.json").write_text("{not json")
    with pytest.raises(PluginCompilationError, match="not JSON"):
        load_manifest(tmp_path)
