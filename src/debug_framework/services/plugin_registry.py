"""``PluginRegistry``: kernel plugins registered, built and validated, persisted in the sessions database.

    registry = PluginRegistry("~/.pie/debug/debug_framework.db")
    registry.register_plugin(load_manifest("examples/plugins/cpp/plugin.json"))   # or the manifest's path
    registry.compile_plugin("examples/plugins/cpp/plugin.json", "cpp")             # build + record
    report = registry.sweep("example-cpp")                                         # the op-by-op sweep
    registry.list_plugins("cpp")                                                   # in any process

Installed plugins are discovered through the entry-point group ``debug_framework.plugins``: each
entry point loads to the path of a plugin manifest (or a callable returning one), e.g. in a
package's ``pyproject.toml``::

    [project.entry-points."debug_framework.plugins"]
    my_kernels = "my_pkg.kernels:MANIFEST"      # MANIFEST = Path(__file__).parent / "plugin.json"
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import DEFAULT_CONFIG, default_database_path, from_environment, merge_config
from ..errors import PluginCompilationError
from ..jsonio import JsonObject, JsonValue
from ..plugins.manifest import PluginDefinition, load_manifest
from ..plugins.sweep import SweepReport, sweep_plugin
from ..storage.database import Database, DatabaseLike, open_database
from .compilation_engine import BuildResult, CompilationEngine, plugin_definition

if TYPE_CHECKING:
    from ..plugins.swap import PluginBackend

__all__ = ["PluginRegistry", "ENTRY_POINT_GROUP", "installed_plugins", "plugin_backend_factory"]

#: The entry-point group installed plugins are discovered through.
ENTRY_POINT_GROUP = "debug_framework.plugins"


def installed_plugins() -> list[tuple[str, PluginDefinition | PluginCompilationError]]:
    """``(entry point name, definition or the error loading it)`` for every installed plugin."""
    found: list[tuple[str, PluginDefinition | PluginCompilationError]] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
            path = target() if callable(target) else target
            found.append((ep.name, load_manifest(Path(os.fspath(path)))))
        except PluginCompilationError as exc:
            found.append((ep.name, exc))
        except Exception as exc:  # noqa: BLE001 - a broken installed package must not break the registry
            found.append((ep.name, PluginCompilationError(f"entry point {ep.name!r} ({ep.value}) failed to load: {exc}",
                                                          hint="fix or uninstall the package providing it")))
    return found


#: Plugins resolved in this process: id -> (definition, artifact); ``plugin:<id>`` looks here first.
_RESOLVED: dict[str, tuple[PluginDefinition, Path]] = {}


def plugin_backend_factory(plugin_id: str) -> Callable[..., PluginBackend]:
    """The factory of backend ``plugin:<id>``: the plugin resolved in this process (``debug_validate
    --plugin`` does that), else the one registered in the configured database, built if needed.

    Raises:
        BackendInitializationError (DF002): no such plugin, or it cannot be built here.
    """
    from functools import partial

    from ..errors import BackendInitializationError
    from ..plugins.swap import PluginBackend

    try:
        resolved = _RESOLVED.get(plugin_id)
        if resolved is None:
            with PluginRegistry() as registry:
                resolved = registry.artifact(plugin_id)
        defn, artifact = resolved
    except PluginCompilationError as exc:
        raise BackendInitializationError(f"plugin backend unavailable: {exc.message}", backend=f"plugin:{plugin_id}",
                                         hint=exc.hint) from exc
    return partial(PluginBackend, defn, artifact)


def _definition(row: Mapping[str, JsonValue]) -> PluginDefinition:
    """The definition stored in a plugin row; a damaged one is DF008 naming the plugin."""
    try:
        return PluginDefinition.from_dict(row["definition"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PluginCompilationError("the stored definition of this plugin is damaged", plugin=row.get("plugin_id"),
                                     hint="register it again from its manifest (plugin_compile --plugin-path ...)"
                                     ) from exc


class PluginRegistry:
    """Plugins by id, in the sessions database (table ``plugins``).

    Args:
        db: an open :class:`~debug_framework.storage.database.Database`, a database path, or None for
            the configured one (``PIE_DEBUG_DATABASE``, else ``~/.pie/debug/debug_framework.db``).
        engine: the compilation engine (default: one over the default build cache).
        discover: register installed plugins (entry-point group ``debug_framework.plugins``) on first listing.
    """

    def __init__(self, db: DatabaseLike | None = None, *, engine: CompilationEngine | None = None,
                 discover: bool = True) -> None:
        if db is None:
            db = merge_config(DEFAULT_CONFIG, from_environment())["database_path"]
        if not isinstance(db, Database):
            db = default_database_path({"database_path": os.fspath(db)})  # ~ expanded; a server URL as given
        self._owns_db = not isinstance(db, Database)
        self.db: Database = open_database(db)
        self.engine = engine or CompilationEngine()
        self._discover = discover
        self.discovery_errors: list[PluginCompilationError] = []

    def close(self) -> None:
        """Close the database connections this registry opened (a database passed in stays open)."""
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> PluginRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------- the spec's methods

    def register_plugin(self, plugin_definition: PluginDefinition | str | os.PathLike[str], *,
                        origin: str = "manifest") -> bool:
        """Register a plugin (a definition or its manifest's path); re-registering replaces it."""
        defn = plugin_definition if isinstance(plugin_definition, PluginDefinition) else load_manifest(plugin_definition)
        self.db.plugins.upsert(defn.id, defn.version, defn.backend_type, defn.to_dict(),
                               manifest_path=None if defn.manifest_path is None else str(defn.manifest_path),
                               origin=origin)
        return True

    def get_plugin(self, plugin_id: str) -> PluginDefinition | None:
        """The plugin registered under ``plugin_id`` (installed plugins included), or None."""
        row = self.db.plugins.get(plugin_id)
        if row is None and self._discover:
            self.discover()
            row = self.db.plugins.get(plugin_id)
        return None if row is None else _definition(row)

    def list_plugins(self, backend_type: str | None = None) -> list[PluginDefinition]:
        """Registered plugins (of ``backend_type`` when given), installed ones included, by id."""
        if self._discover:
            self.discover()
        return [_definition(r) for r in self.db.plugins.list(backend_type)]

    def compile_plugin(self, source_path: str | os.PathLike[str], backend_type: str,
                       output_path: str | os.PathLike[str] | None = None) -> bool:
        """Register (a manifest) and build a plugin, recording the build; a lone source file is built
        as a plugin named after it. DF008 when the build fails (the log's path in the message)."""
        defn = plugin_definition(source_path, backend_type)
        self.register_plugin(defn)
        self.build(defn, output_path)
        return True

    # ------------------------------------------------------------------------------- the rest

    def discover(self) -> list[PluginDefinition]:
        """Register every installed plugin; errors are kept on :attr:`discovery_errors`."""
        self.discovery_errors = []
        found = []
        for _name, item in installed_plugins():
            if isinstance(item, PluginCompilationError):
                self.discovery_errors.append(item)
                continue
            self.register_plugin(item, origin="entry_point")
            found.append(item)
        return found

    def require(self, plugin_id: str) -> PluginDefinition:
        """:meth:`get_plugin`, or DF008 listing the registered ids."""
        defn = self.get_plugin(plugin_id)
        if defn is None:
            known = [p.id for p in self.list_plugins()]
            raise PluginCompilationError(f"no plugin {plugin_id!r} is registered", plugin=plugin_id,
                                         hint=f"registered: {', '.join(known) or 'none'}; register one with "
                                              "plugin_compile --plugin-path plugin.json")
        return defn

    def build(self, plugin: PluginDefinition | str, output_path: str | os.PathLike[str] | None = None,
              level: int | None = None) -> BuildResult:
        """Build a registered plugin (through the cache) and record the build with its full log."""
        defn = self.require(plugin) if isinstance(plugin, str) else plugin
        result = self.engine.build(defn, output_path, level)
        log = result.log_path.read_text(encoding="utf-8", errors="replace") if result.log_path.is_file() else ""
        self.db.plugins.set_build(defn.id, str(result.artifact), result.artifact_digest, result.to_dict(), log)
        return result

    def _given(self, plugin: PluginDefinition | str) -> PluginDefinition:
        """The definition itself, or the one registered under an id now."""
        return plugin if isinstance(plugin, PluginDefinition) else self.require(plugin)

    def artifact(self, plugin: PluginDefinition | str) -> tuple[PluginDefinition, Path]:
        """The plugin and its built artifact (built now when the recorded one is gone or stale).

        Given a definition, exactly that definition is used: its build comes from the content-keyed
        cache, whatever another run registered under the same id since. An id means the definition
        registered under it now."""
        defn = self._given(plugin)
        row = self.db.plugins.get(defn.id) or {}
        path = row.get("artifact_path")
        key = (row.get("build") or {}).get("cache_key")
        if not (path and Path(path).is_file() and key == self.engine.cache_key(defn)):
            path = str(self.engine.build(defn).artifact if self._replaced(defn) else self.build(defn).artifact)
        _RESOLVED[defn.id] = (defn, Path(path))
        return defn, Path(path)

    def validate(self, plugin: PluginDefinition | str, timeout_s: float | None = None) -> JsonObject:
        """``CompilationEngine.validation_report``'s checks (load, ops, opcheck, in a worker process)
        on the build of exactly ``plugin`` (a definition, or the one registered under an id), recorded;
        ``timeout_s`` bounds the worker (default: the sweep's)."""
        defn, artifact = self.artifact(plugin)
        from ..plugins.sweep import check_in_worker

        report = check_in_worker(defn, artifact, defn.backend_type,
                                 **({} if timeout_s is None else {"timeout_s": timeout_s}))
        self._record_validation(defn, {"compilation": report})
        return report

    def sweep(self, plugin: PluginDefinition | str, **options: Any) -> SweepReport:
        """The op-by-op sweep of exactly ``plugin``'s build (``options``: :func:`sweep_plugin`'s), recorded."""
        defn, artifact = self.artifact(plugin)
        report = sweep_plugin(defn, artifact, **options)
        self._record_validation(defn, {"sweep": report.to_dict()})
        return report

    def _replaced(self, defn: PluginDefinition) -> bool:
        """Whether the row under ``defn.id`` now holds another definition (another run registered one)."""
        row = self.db.plugins.get(defn.id)
        if row is None:
            return False
        try:
            return _definition(row).digest != defn.digest
        except (PluginCompilationError, OSError):
            return True

    def _record_validation(self, defn: PluginDefinition, part: JsonObject) -> None:
        """Keep ``part`` on the row when the row still holds ``defn`` (keyed by id and content digest):
        a run never writes its results onto another definition registered under the same id."""
        if self._replaced(defn):
            return
        row = self.db.plugins.get(defn.id) or {}
        previous = row.get("validation") or {}
        if previous.get("definition_digest") != defn.digest:
            previous = {}  # results of an earlier definition under this id are not this one's
        self.db.plugins.set_validation(defn.id, {**previous, **part, "definition_digest": defn.digest})

    def swap_in(self, manifest: str | os.PathLike[str]) -> str:
        """Register and build the plugin at ``manifest`` for this process; the backend name
        ``plugin:<id>`` that runs the PyTorch model with its kernels (``debug_validate --plugin``)."""
        defn = load_manifest(manifest)
        self.register_plugin(defn)
        self.artifact(defn)
        return f"plugin:{defn.id}"

    def record(self, plugin_id: str) -> JsonObject | None:
        """The stored row: definition, build (with the full log), validation results."""
        return self.db.plugins.get(plugin_id)
