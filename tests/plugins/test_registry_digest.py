"""Plugin validation uses exactly the manifest it was given (issue 33, item 4): two definitions
registered under one id never see each other's kernels or results (keyed by id + content digest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from debug_framework.plugins.manifest import load_manifest
from debug_framework.services.compilation_engine import CompilationEngine
from debug_framework.services.plugin_registry import PluginRegistry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def _second(tmp_path: Path):
    """The Triton example under the same id with another kernel name (another definition)."""
    folder = tmp_path / "other"
    shutil.copytree(EXAMPLES / "triton", folder)
    data = json.loads((folder / "plugin.json").read_text())
    data["kernels"][0]["name"] = "softmax_other"
    (folder / "plugin.json").write_text(json.dumps(data))
    return load_manifest(folder)


def test_runs_sharing_an_id_never_see_each_other(tmp_path):
    a = load_manifest(EXAMPLES / "triton")
    b = _second(tmp_path)
    assert a.id == b.id and a.digest != b.digest and a.digest == load_manifest(EXAMPLES / "triton").digest
    with PluginRegistry(tmp_path / "r.db", engine=CompilationEngine(tmp_path / "cache"), discover=False) as reg:
        reg.register_plugin(a)
        reg.register_plugin(b)  # another run registers its definition under the same id meanwhile
        defn, artifact = reg.artifact(a)
        assert [k.name for k in defn.kernels] == ["softmax"] and artifact.is_file()
        reg._record_validation(a, {"sweep": {"kernels": {"softmax": {}}}})
        assert not (reg.record(a.id) or {}).get("validation")  # a's results are not written onto b's row
        reg._record_validation(b, {"sweep": {"kernels": {"softmax_other": {}}}})
        assert reg.record(b.id)["validation"]["definition_digest"] == b.digest
        reg.register_plugin(a)
        reg._record_validation(a, {"compilation": {"passed": True}})
        validation = reg.record(a.id)["validation"]
        assert validation["definition_digest"] == a.digest and "sweep" not in validation  # b's sweep dropped
