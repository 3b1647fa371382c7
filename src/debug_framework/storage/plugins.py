"""The plugin registry's table (``plugins``, schema version 4): one row per plugin id with its
definition, its latest build (artifact path and digest, the full build log) and its last
validation results, so ``PluginRegistry.list_plugins`` sees the same plugins in every process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..jsonio import JsonObject, JsonValue, as_float

from .core import Row, SqlCore
from .dialect import Connection, Dialect
from .values import decode_json_columns, to_json, utc_now

__all__ = ["PluginStore", "PluginRecord", "KernelSweep", "plugin_tables"]


def plugin_tables(d: Dialect) -> tuple[str, ...]:
    """Version 3's new table and index."""
    j = d.json_type
    return (
        f"""CREATE TABLE plugins (
        plugin_id       TEXT PRIMARY KEY,
        version         TEXT NOT NULL,
        backend_type    TEXT NOT NULL,
        manifest_path   TEXT,
        definition      {j} NOT NULL,
        origin          TEXT NOT NULL DEFAULT 'manifest',
        artifact_path   TEXT,
        artifact_digest TEXT,
        build           {j},
        build_log       TEXT,
        validation      {j},
        created_at      TEXT NOT NULL,
        updated_at      TEXT NOT NULL
    )""",
        "CREATE INDEX IF NOT EXISTS idx_plugins_backend ON plugins(backend_type)",
    )


def _row(row: Row) -> JsonObject:
    """A plugin row with its JSON decoded; a damaged column reads as None, named in ``damaged_json``."""
    return decode_json_columns(dict(row), ("definition", "build", "validation"))


def _object(value: JsonValue) -> Mapping[str, JsonValue]:
    return value if isinstance(value, Mapping) else {}


#: A kernel's op-sweep figures as the plugins page shows them (column -> key of the stored sweep).
KERNEL_COLUMNS = {"op": "op", "pass rate": "pass_rate", "passed": "passed_samples", "applicable": "applicable",
                  "failed": "failed", "errors": "errors", "crashes": "crashes", "hangs": "hangs",
                  "skipped": "skipped", "repro": "repro", "repro verified": "repro_verified"}


@dataclass(frozen=True)
class KernelSweep:
    """One kernel's op-sweep outcome: its figures by :data:`KERNEL_COLUMNS` and its worst sample."""

    name: str
    figures: JsonObject
    worst: JsonValue = None

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, JsonValue]) -> KernelSweep:
        return cls(name, {column: d[key] if key in d else None for column, key in KERNEL_COLUMNS.items()},
                   d["worst"] if "worst" in d else None)


@dataclass(frozen=True)
class PluginRecord:
    """One ``plugins`` row as the dashboard shows it: its build and its last op sweep (None: none)."""

    plugin_id: str
    version: str = ""
    backend_type: str = ""
    artifact_path: str | None = None
    cache_key: str = ""
    sweep_passed: bool | None = None
    sweep_samples: JsonValue = None
    sweep_seconds: float = 0.0
    kernels: tuple[KernelSweep, ...] = field(default_factory=tuple)

    @classmethod
    def from_row(cls, row: Mapping[str, JsonValue]) -> PluginRecord:
        """The record of a row as :meth:`PluginStore.list` returns it (a damaged JSON column reads as none)."""
        build, sweep = _object(row.get("build")), _object(_object(row.get("validation")).get("sweep"))
        artifact = row.get("artifact_path")
        return cls(plugin_id=str(row["plugin_id"]), version=str(row.get("version") or ""),
                   backend_type=str(row.get("backend_type") or ""), artifact_path=str(artifact) if artifact else None,
                   cache_key=str(build.get("cache_key") or ""),
                   sweep_passed=bool(sweep.get("passed")) if sweep else None, sweep_samples=sweep.get("samples"),
                   sweep_seconds=as_float(sweep.get("seconds")) or 0.0,
                   kernels=tuple(KernelSweep.from_dict(str(k), v) for k, v in _object(sweep.get("kernels")).items()
                                 if isinstance(v, Mapping)))


class PluginStore:
    """Plugins by id: definition, latest build, last validation."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def upsert(self, plugin_id: str, version: str, backend_type: str, definition: Mapping[str, object], *,
               manifest_path: str | None = None, origin: str = "manifest") -> None:
        """Insert or replace a plugin's definition (its build and validation are kept when the
        definition is unchanged, cleared when it changed)."""
        def do(c: Connection) -> None:
            now = utc_now()
            text = to_json(dict(definition))
            old = self.core.execute(c, "SELECT definition FROM plugins WHERE plugin_id = ?", (plugin_id,)).fetchone()
            if old is None:
                self.core.execute(
                    c, "INSERT INTO plugins (plugin_id, version, backend_type, manifest_path, definition, origin,"
                       " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?)",
                    (plugin_id, version, backend_type, manifest_path, text, origin, now, now))
            elif old[0] != text:
                self.core.execute(
                    c, "UPDATE plugins SET version = ?, backend_type = ?, manifest_path = ?, definition = ?, origin = ?,"
                       " artifact_path = NULL, artifact_digest = NULL, build = NULL, build_log = NULL,"
                       " validation = NULL, updated_at = ? WHERE plugin_id = ?",
                    (version, backend_type, manifest_path, text, origin, now, plugin_id))

        self.core.run_in_transaction(do, f"register plugin {plugin_id}")

    def set_build(self, plugin_id: str, artifact_path: str, artifact_digest: str, build: Mapping[str, object],
                  build_log: str) -> None:
        """Record the plugin's latest build (its validation is cleared: it was of another build)."""
        self.core.run_in_transaction(
            lambda c: self.core.execute(
                c, "UPDATE plugins SET artifact_path = ?, artifact_digest = ?, build = ?, build_log = ?,"
                   " validation = CASE WHEN artifact_digest = ? THEN validation ELSE NULL END, updated_at = ?"
                   " WHERE plugin_id = ?",
                (artifact_path, artifact_digest, to_json(dict(build)), build_log, artifact_digest, utc_now(),
                 plugin_id)),
            f"record the build of plugin {plugin_id}")

    def set_validation(self, plugin_id: str, validation: Mapping[str, object]) -> None:
        """Record the last validation (compilation checks and/or the op sweep) of the plugin's build."""
        self.core.run_in_transaction(
            lambda c: self.core.execute(c, "UPDATE plugins SET validation = ?, updated_at = ? WHERE plugin_id = ?",
                                        (to_json(dict(validation)), utc_now(), plugin_id)),
            f"record the validation of plugin {plugin_id}")

    def get(self, plugin_id: str) -> JsonObject | None:
        """The plugin's row (JSON columns decoded), or None."""
        row = self.core.read(
            lambda c: self.core.execute(c, "SELECT * FROM plugins WHERE plugin_id = ?", (plugin_id,)).fetchone(),
            f"read plugin {plugin_id}")
        return None if row is None else _row(row)

    def list(self, backend_type: str | None = None) -> list[JsonObject]:
        """Every plugin (of ``backend_type`` when given), by id."""
        def rd(c: Connection) -> list[Row]:
            if backend_type is None:
                return self.core.execute(c, "SELECT * FROM plugins ORDER BY plugin_id").fetchall()
            return self.core.execute(c, "SELECT * FROM plugins WHERE backend_type = ? ORDER BY plugin_id",
                                     (backend_type,)).fetchall()

        return [_row(r) for r in self.core.read(rd, "list plugins")]

    def delete(self, plugin_id: str) -> bool:
        """Forget a plugin; True when it was there."""
        n = self.core.run_in_transaction(
            lambda c: self.core.execute(c, "DELETE FROM plugins WHERE plugin_id = ?", (plugin_id,)).rowcount,
            f"delete plugin {plugin_id}")
        return bool(n)
