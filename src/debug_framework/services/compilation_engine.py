"""``CompilationEngine``: plugin sources to a loadable artifact, through a content-addressed cache.

    engine = CompilationEngine(cache_dir="~/.pie/debug/plugin-builds", optimization_level=2)
    build = engine.build(load_manifest("examples/plugins/cpp/plugin.json"))
    build.artifact, build.cached, build.log_path
    engine.validation_report(build.artifact, "cpp")["passed"]   # loads it, checks its ops, runs opcheck

The cache key is the SHA-256 of the sources (names and bytes), the backend type, the compiler and
its version, the flags of the optimisation level, torch's version and the platform, so an unchanged
plugin compiles once. Each cache entry holds the artifact, ``build.log`` (every command and its full
output) and ``build.json`` (what was built, from what, with which flags). A failed build keeps its log
under ``failed/<key>/build.log`` and raises :class:`~debug_framework.errors.PluginCompilationError`
(DF008) with the compiler's first error as ``file:line: message`` and the log's path.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..compat import CompilationFaces
from ..errors import PluginCompilationError
from ..plugins.manifest import BACKEND_TYPES, PluginDefinition, load_manifest, source_digest
from ..plugins.toolchain import OPT_FLAGS, CompilerError, build_commands, check_python_sources, run_commands, toolchain

__all__ = ["CompilationEngine", "BuildResult", "DEFAULT_CACHE_DIR", "ARTIFACT_SUFFIX", "build_record_path",
           "plugin_definition", "single_source_definition"]

#: Where builds are cached unless ``cache_dir`` is given (beside the default session database).
DEFAULT_CACHE_DIR = Path("~/.pie/debug/plugin-builds")
#: The artifact's file suffix per backend type.
ARTIFACT_SUFFIX = {"cpp": ".so", "cuda": ".so", "metal": ".metallib", "triton": ".py"}


@dataclass(frozen=True)
class BuildResult:
    """One build: the artifact (in the cache), its digest, the log, and whether the cache served it."""

    plugin_id: str
    backend_type: str
    artifact: Path
    artifact_digest: str
    cache_key: str
    log_path: Path
    cached: bool
    seconds: float
    optimization_level: int
    flags: tuple[str, ...]
    compiler: str
    manifest_path: Path | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def build_record_path(artifact: Path) -> Path:
    """The ``build.json`` describing ``artifact`` (beside it in the cache, or ``<output>.build.json``)."""
    beside = artifact.parent / "build.json"
    return beside if beside.is_file() else artifact.with_name(artifact.name + ".build.json")


def _sha256(path: Path) -> str:
    from ..plugins.loading import file_digest

    return file_digest(path)


class CompilationEngine(CompilationFaces):
    """Builds plugins with the system's compilers, caching by content.

    Args:
        cache_dir: the build cache (default ``~/.pie/debug/plugin-builds``).
        optimization_level: 0-3, mapped to each compiler's flags (``plugins.toolchain.OPT_FLAGS``).
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, optimization_level: int = 2) -> None:
        self.cache_dir = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
        self.optimization_level = self._level(optimization_level)

    @staticmethod
    def _level(level: int) -> int:
        if not isinstance(level, int) or level not in (0, 1, 2, 3):
            raise PluginCompilationError(f"optimization level must be 0, 1, 2 or 3, got {level!r}",
                                         hint="pass --optimization-level 0-3")
        return level

    # ------------------------------------------------------------------------------ building

    def cache_key(self, defn: PluginDefinition, level: int | None = None) -> str:
        """The content address of ``defn``'s build at ``level`` on this machine."""
        lvl = self.optimization_level if level is None else self._level(level)
        tc = toolchain(defn.backend_type)
        import torch

        manifest = {k: v for k, v in defn.to_dict().items() if k not in ("sources", "manifest_path")}
        parts = {"sources": source_digest(list(defn.sources)), "plugin": manifest, "backend": defn.backend_type,
                 "compiler": tc.compiler, "compiler_version": tc.version, "flags": OPT_FLAGS[defn.backend_type][lvl],
                 "torch": torch.__version__, "python": sys.version_info[:2], "platform": platform.platform(),
                 "machine": platform.machine()}
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    def build(self, defn: PluginDefinition, output_path: str | os.PathLike[str] | None = None,
              level: int | None = None) -> BuildResult:
        """Build ``defn`` (or take it from the cache) and copy the artifact to ``output_path`` if given.

        Raises:
            PluginCompilationError (DF008): no toolchain for the backend here (the reason), or the
                compiler failed (its first error and the log's path).
        """
        lvl = self.optimization_level if level is None else self._level(level)
        tc = toolchain(defn.backend_type)
        if not tc.available:
            raise PluginCompilationError(f"cannot compile a {defn.backend_type} plugin here: {tc.reason}",
                                         plugin=defn.id, hint="build it on a machine with the toolchain")
        key = self.cache_key(defn, lvl)
        entry = self.cache_dir / key[:2] / key
        artifact = entry / (defn.id + ARTIFACT_SUFFIX[defn.backend_type])
        start = time.perf_counter()
        cached = artifact.is_file() and (entry / "build.json").is_file()
        if not cached:
            self._compile_into(defn, entry, artifact, lvl, key)
        result = BuildResult(defn.id, defn.backend_type, artifact, _sha256(artifact), key, entry / "build.log", cached,
                             time.perf_counter() - start, lvl, OPT_FLAGS[defn.backend_type][lvl],
                             f"{tc.compiler} ({tc.version})", defn.manifest_path)
        if output_path is not None:
            self._publish(result, Path(output_path).expanduser())
        return result

    def _compile_into(self, defn: PluginDefinition, entry: Path, artifact: Path, level: int, key: str) -> None:
        """Compile in a private folder, then move it into place (concurrent builders never see half a build)."""
        tc = toolchain(defn.backend_type)
        entry.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=entry.parent))
        out = work / artifact.name
        try:
            if defn.backend_type == "triton":
                log = check_python_sources(list(defn.sources))
                for src in defn.sources:  # the entry module first; helpers beside it
                    shutil.copy2(src, work / src.name)
                shutil.copy2(defn.sources[0], out)
            else:
                assert tc.compiler is not None
                log = run_commands(build_commands(defn.backend_type, tc.compiler, list(defn.sources), out, level), work)
        except CompilerError as exc:
            failed = self.cache_dir / "failed" / key
            failed.mkdir(parents=True, exist_ok=True)
            (failed / "build.log").write_text(exc.log, encoding="utf-8")
            shutil.rmtree(work, ignore_errors=True)
            raise PluginCompilationError(f"{exc.first}", plugin=defn.id, log=str(failed / "build.log"),
                                         hint="fix the source at the file:line shown; the full build log is at "
                                              "the path given") from exc
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        (work / "build.log").write_text(log, encoding="utf-8")
        record = {"plugin": defn.to_dict(), "backend_type": defn.backend_type, "artifact": artifact.name,
                  "cache_key": key, "optimization_level": level, "flags": list(OPT_FLAGS[defn.backend_type][level]),
                  "compiler": tc.compiler, "compiler_version": tc.version}
        (work / "build.json").write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
        try:
            os.replace(work, entry)
        except OSError as exc:  # another process finished the same build first: keep theirs
            shutil.rmtree(work, ignore_errors=True)
            if not artifact.is_file():
                raise PluginCompilationError(f"cannot place the build in the cache: {exc}", plugin=defn.id,
                                             cache=str(entry), hint="remove that cache entry and build again"
                                             ) from exc

    @staticmethod
    def _publish(result: BuildResult, output: Path) -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(result.artifact, output)
        shutil.copy2(result.artifact.parent / "build.json", output.with_name(output.name + ".build.json"))

    def build_source(self, source_path: str | os.PathLike[str], backend_type: str,
                     output_path: str | os.PathLike[str] | None = None) -> BuildResult:
        """Build the plugin at ``source_path`` (a manifest, its folder, or one source file of
        ``backend_type``, built as a plugin named after it) and copy the artifact to ``output_path``
        if given. DF008 on failure. The spec's ``compile_cuda_kernel``/``compile_metal_kernel`` (and
        ``validate_compilation``) are faces over this and :meth:`validation_report`, in
        :class:`debug_framework.compat.CompilationFaces`."""
        return self.build(plugin_definition(source_path, backend_type), output_path)

    def validation_report(self, compiled_path: str | os.PathLike[str], backend_type: str) -> dict[str, Any]:
        """Load the artifact (in a worker process), check the ops (or Metal functions) its plugin
        declares are there, and run ``torch.library.opcheck`` on each registered op: per kernel, its
        op, schema, and opcheck results, and ``passed``.

        Raises:
            PluginCompilationError (DF008): a missing or unloadable artifact, a missing op or symbol.
        """
        from ..plugins.sweep import check_in_worker

        if backend_type not in BACKEND_TYPES:
            raise PluginCompilationError(f"unknown backend type {backend_type!r}", hint=f"use one of {BACKEND_TYPES}")
        artifact = Path(compiled_path).expanduser()
        record_path = build_record_path(artifact)
        defn = None
        if record_path.is_file():
            try:
                defn = PluginDefinition.from_dict(json.loads(record_path.read_text(encoding="utf-8"))["plugin"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise PluginCompilationError(f"the build record beside the artifact is unreadable: {exc}",
                                             artifact=str(artifact), record=str(record_path),
                                             hint="build the plugin again (plugin_compile --plugin-path ...)") from exc
        if not artifact.is_file():
            raise PluginCompilationError("the compiled artifact does not exist", artifact=str(artifact))
        return check_in_worker(defn, artifact, backend_type)


def plugin_definition(source_path: str | os.PathLike[str], backend_type: str | None) -> PluginDefinition:
    """The plugin at ``source_path``: a manifest (or its folder), whose backend must be
    ``backend_type`` when given, or one source file of ``backend_type``."""
    src = Path(source_path).expanduser()
    if src.is_dir() or src.suffix == ".json":
        defn = load_manifest(src)
        if backend_type is not None and defn.backend_type != backend_type:
            raise PluginCompilationError(f"the manifest is a {defn.backend_type} plugin, not {backend_type}",
                                         manifest=str(defn.manifest_path), field="backend")
        return defn
    if backend_type is None:
        raise PluginCompilationError("the backend type of a lone source file must be given", file=str(src),
                                     hint="pass --backend cpp|cuda|triton|metal")
    return single_source_definition(src, backend_type)


def single_source_definition(src: Path, backend_type: str) -> PluginDefinition:
    """A plugin of one source file and no declared kernels (``plugin_compile --plugin-path file.cpp``)."""
    if backend_type not in BACKEND_TYPES:
        raise PluginCompilationError(f"unknown backend type {backend_type!r}", hint=f"use one of {', '.join(BACKEND_TYPES)}")
    if not src.is_file():
        raise PluginCompilationError("the plugin source does not exist", file=str(src))
    pid = "".join(c if c.isalnum() or c in "_-." else "_" for c in src.stem)[:64] or "plugin"
    return PluginDefinition(pid, "0", backend_type, (src.resolve(),), (), None)
