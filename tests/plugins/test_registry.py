"""PluginRegistry: persisted in the sessions database (seen from another process), builds and their
logs recorded, installed plugins discovered through the entry-point group."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from debug_framework.errors import PluginCompilationError
from debug_framework.plugins.manifest import load_manifest
from debug_framework.services.compilation_engine import CompilationEngine
from debug_framework.services.plugin_registry import ENTRY_POINT_GROUP, PluginRegistry

from .conftest import EXAMPLES, ROOT


@pytest.fixture
def registry(tmp_path):
    return PluginRegistry(tmp_path / "s.db", engine=CompilationEngine(tmp_path / "cache"), discover=False)


@pytest.fixture
def any_registry(any_db, tmp_path):
    return PluginRegistry(any_db, engine=CompilationEngine(tmp_path / "cache"), discover=False)


def test_register_get_list_and_filter(any_registry):
    registry = any_registry  # on both engines
    assert registry.register_plugin(load_manifest(EXAMPLES / "cpp"))
    assert registry.register_plugin(EXAMPLES / "triton" / "plugin.json")  # a manifest path works too
    assert registry.get_plugin("example-cpp") == load_manifest(EXAMPLES / "cpp")
    assert registry.get_plugin("nope") is None
    assert [p.id for p in registry.list_plugins()] == ["example-cpp", "example-triton"]
    assert [p.id for p in registry.list_plugins("triton")] == ["example-triton"]
    with pytest.raises(PluginCompilationError, match="registered: example-cpp, example-triton"):
        registry.require("nope")


@pytest.mark.slow  # a second Python process
def test_the_registry_is_seen_from_another_process(registry, tmp_path):
    registry.register_plugin(EXAMPLES / "triton")
    code = textwrap.dedent(f"""
        from debug_framework.services.plugin_registry import PluginRegistry
        print([p.id for p in PluginRegistry({str(tmp_path / 's.db')!r}, discover=False).list_plugins("triton")])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.stdout.strip() == "['example-triton']", out.stderr


def test_compile_plugin_records_the_build_and_its_full_log(registry):
    assert registry.compile_plugin(EXAMPLES / "triton" / "plugin.json", "triton")
    row = registry.record("example-triton")
    assert row["artifact_digest"] and row["artifact_path"].endswith("example-triton.py")
    assert "checked" in row["build_log"] and row["build"]["cache_key"]
    assert row["validation"] is None
    with pytest.raises(PluginCompilationError, match="not cpp"):
        registry.compile_plugin(EXAMPLES / "triton" / "plugin.json", "cpp")


def test_a_changed_definition_forgets_the_old_build(registry, tmp_path):
    folder = tmp_path / "p"
    shutil.copytree(EXAMPLES / "triton", folder)
    registry.compile_plugin(folder / "plugin.json", "triton")
    data = json.loads((folder / "plugin.json").read_text())
    data["version"] = "2.0.0"
    (folder / "plugin.json").write_text(json.dumps(data))
    registry.register_plugin(folder / "plugin.json")
    row = registry.record("example-triton")
    assert row["version"] == "2.0.0" and row["artifact_digest"] is None


def test_installed_plugins_are_discovered_through_entry_points(tmp_path, monkeypatch):
    site = tmp_path / "site"
    shutil.copytree(EXAMPLES / "triton", site / "fakekernels_data")
    (site / "fakekernels.py").write_text(
        "from pathlib import Path\nMANIFEST = Path(__file__).parent / 'fakekernels_data' / 'plugin.json'\n")
    dist = site / "fakekernels-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakekernels\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nsoftmax = fakekernels:MANIFEST\n"
                                           "broken = fakekernels_missing_module:MANIFEST\n")
    monkeypatch.syspath_prepend(str(site))
    registry = PluginRegistry(tmp_path / "s.db", engine=CompilationEngine(tmp_path / "cache"))
    assert [p.id for p in registry.list_plugins()] == ["example-triton"]
    assert registry.record("example-triton")["origin"] == "entry_point"
    assert len(registry.discovery_errors) == 1 and "broken" in registry.discovery_errors[0].message


def test_a_version_3_file_gains_the_plugins_table_and_keeps_its_sessions(tmp_path):
    import sqlite3

    from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager

    path = tmp_path / "v3.db"
    db = DatabaseManager(path)
    sid = db.create_session("/m", "python_reference", "pytorch")
    db.close()
    conn = sqlite3.connect(path)  # make it a version-3 file: no plugins table, no steps 4 and later
    conn.executescript("DROP TABLE op_sweep_results; DROP TABLE op_sweeps; DROP TABLE plugins; DROP TABLE dashboard_tasks; "
                       "DELETE FROM schema_version WHERE version >= 4;")
    conn.commit()
    conn.close()
    assert DatabaseManager(path, initialize=False).schema_version() == 3
    db = DatabaseManager(path)
    assert db.schema_version() == SCHEMA_VERSION >= 4
    assert db.get_session(sid)["model_path"] == "/m"
    registry = PluginRegistry(db, discover=False)
    registry.register_plugin(EXAMPLES / "triton")
    assert [p.id for p in registry.list_plugins()] == ["example-triton"]


def test_a_damaged_stored_definition_is_df008_naming_the_plugin(registry):
    registry.register_plugin(EXAMPLES / "triton")
    registry.db.execute_query("UPDATE plugins SET definition = ? WHERE plugin_id = ?", ("{not json", "example-triton"))
    with pytest.raises(PluginCompilationError, match="damaged") as info:
        registry.get_plugin("example-triton")
    assert info.value.context["plugin"] == "example-triton"
    with pytest.raises(PluginCompilationError, match="damaged"):
        registry.list_plugins()
