"""Maintenance of a session database and the files beside it (docs/storage.md, "Maintenance").

    report = run_maintenance("/tmp/debug.db", dry_run=True, older_than_days=30)
    print("\\n".join(report.lines()))          # what would go, and the bytes it would free

One pass, in this order (each step sees the previous one's decisions, so a dry run lists exactly
what the real run removes):

1. **stale sweep** - running sessions and batch items whose owner process is gone
   (:func:`debug_framework.storage.leases.sweep`);
2. **retention** - finished sessions (passed/failed/error) older than ``older_than_days``
   (default ``config["retention_days"]``; None keeps everything) are deleted with their rows;
3. **saved inputs** - ``<db name>_inputs/<session>.safetensors`` files of sessions that no longer
   exist (older than ``grace_s``, so a session being created keeps its file);
4. **artifacts** - ``<db name>_artifacts/<session>/`` folders (a backend's exports and their logs) of
   sessions that no longer exist, under the same grace;
5. **tensor store** - content-addressed blobs no kept recording references (older than ``grace_s``);
6. **database** - ``PRAGMA optimize`` and ``VACUUM`` (SQLite; ``ANALYZE``/``VACUUM`` on PostgreSQL).

:func:`auto_maintenance` is what an engine start runs with ``auto_cleanup``: the stale sweep every
time (a single read when nothing is stale) and ``PRAGMA optimize`` at most once per
``maintenance_interval`` (recorded in the ``maintenance_runs`` table, shared by every process).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ResourceSettings, database_settings, merge_config, resource_settings
from ..errors import DebugFrameworkError
from ..jsonio import JsonObject
from ..storage.database import Database, DatabaseLike, open_database
from ..storage.leases import SweepReport, sweep
from ..storage.sessions import TERMINAL_STATUSES
from ..storage.values import parse_time

__all__ = ["MaintenanceReport", "RemovedFile", "run_maintenance", "auto_maintenance", "AutoMaintenance",
           "inputs_dir_of", "artifacts_dir_of"]

_LOG = logging.getLogger("debug_framework.maintenance")
_DAY_S = 86400.0
_INPUTS_SUFFIX = ".safetensors"


def inputs_dir_of(database_path: str | os.PathLike[str]) -> Path:
    """Where the engine saves the sessions' inputs: ``<db dir>/<db name>_inputs/``."""
    p = Path(database_path)
    return p.parent / f"{p.stem}_inputs"


def artifacts_dir_of(database_path: str | os.PathLike[str]) -> Path:
    """Where the sessions' backends keep their files: ``<db dir>/<db name>_artifacts/``."""
    p = Path(database_path)
    return p.parent / f"{p.stem}_artifacts"


@dataclass(frozen=True)
class RemovedFile:
    """A file maintenance removed (or, in a dry run, would remove)."""

    path: str
    nbytes: int

    def to_dict(self) -> JsonObject:
        return {"path": self.path, "bytes": self.nbytes}


@dataclass
class MaintenanceReport:
    """What one maintenance pass removed (``dry_run``: would remove) and the bytes it freed."""

    database: str
    dry_run: bool
    swept: SweepReport = field(default_factory=SweepReport)
    expired_sessions: list[str] = field(default_factory=list)
    inputs: list[RemovedFile] = field(default_factory=list)
    artifacts: list[RemovedFile] = field(default_factory=list)
    tensors: list[RemovedFile] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    database_bytes_freed: int = 0

    @property
    def freed_bytes(self) -> int:
        """Bytes freed (or freeable) in all: files removed plus the database's shrinkage."""
        return sum(f.nbytes for f in (*self.inputs, *self.artifacts, *self.tensors)) + self.database_bytes_freed

    def to_dict(self) -> JsonObject:
        return {"database": self.database, "dry_run": self.dry_run, **self.swept.to_dict(),
                "expired_sessions": list(self.expired_sessions),
                "removed_inputs": [f.to_dict() for f in self.inputs],
                "removed_artifacts": [f.to_dict() for f in self.artifacts],
                "removed_tensors": [f.to_dict() for f in self.tensors],
                "database_statements": list(self.statements), "database_bytes_freed": self.database_bytes_freed,
                "freed_bytes": self.freed_bytes}

    def lines(self) -> list[str]:
        """The report as text lines (paths and ids printed as they are; the CLI prints them literally)."""
        verb = "would remove" if self.dry_run else "removed"
        out = [f"maintenance of {self.database}" + (" (dry run: nothing changed)" if self.dry_run else "")]
        for sid in self.swept.sessions:
            out.append(f"  abandoned session {sid}: owner process gone -> error")
        for job, idx in self.swept.items:
            out.append(f"  abandoned batch item {job}[{idx}]: owner process gone -> pending")
        for sid in self.expired_sessions:
            out.append(f"  {verb} expired session {sid}")
        for what, files in (("saved inputs", self.inputs), ("artifact folder", self.artifacts),
                            ("tensor file", self.tensors)):
            for f in files:
                out.append(f"  {verb} {what} {f.path} ({f.nbytes} bytes)")
        if self.statements:
            out.append(f"  database: {'would run' if self.dry_run else 'ran'} {', '.join(self.statements)}")
        out.append(f"{'would free' if self.dry_run else 'freed'} {self.freed_bytes} bytes "
                   f"({len(self.expired_sessions)} expired sessions, {len(self.inputs)} inputs files, "
                   f"{len(self.artifacts)} artifact folders, "
                   f"{len(self.tensors)} tensor files, {len(self.swept.sessions)} abandoned sessions)")
        return out


def _db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.is_file())


def _finished_before(row: Mapping[str, object], cutoff: float) -> bool:
    for col in ("finished_at", "updated_at", "created_at"):
        try:
            when = parse_time(row.get(col))
        except (TypeError, ValueError):
            continue
        if when is not None:
            return when.timestamp() < cutoff
    return False


def _expired(db: Database, days: float | None) -> list[JsonObject]:
    """Finished sessions older than ``days`` (none when None)."""
    if days is None:
        return []
    cutoff = time.time() - days * _DAY_S
    rows = db.fetch_all("SELECT session_id, status, inputs_ref, finished_at, updated_at, created_at FROM sessions",
                        (), "list sessions for retention")
    return [dict(r) for r in rows if r["status"] in TERMINAL_STATUSES and _finished_before(dict(r), cutoff)]


def _session_entries(folder: Path, keep: set[str], expired: set[str], grace_s: float, *,
                     folders: bool) -> list[RemovedFile]:
    """The entries of ``folder`` named by a session that is gone (older than ``grace_s``) or
    expires now: ``<session>.safetensors`` files, or (``folders``) ``<session>/`` folders sized by
    their files. Links are never followed."""
    if not folder.is_dir():
        return []
    now, out = time.time(), []
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not (path.is_dir() if folders else path.is_file() and path.suffix == _INPUTS_SUFFIX):
            continue
        sid = path.name if folders else path.stem
        if sid in expired or (sid not in keep and now - path.stat().st_mtime >= grace_s):
            files = [f for f in path.rglob("*") if f.is_file() and not f.is_symlink()] if folders else [path]
            out.append(RemovedFile(str(path), sum(int(f.stat().st_size) for f in files)))
    return out


def _orphan_tensors(db: Database, store_root: Path | None, expired: set[str], grace_s: float,
                    dry_run: bool) -> list[RemovedFile]:
    from ..storage.tensor_store import TensorStore

    root = store_root if store_root is not None else TensorStore.root_beside(db.database_path)
    if not root.is_dir():
        return []
    store = TensorStore(root, tensor_recording_limit=None)
    rows = db.fetch_all("SELECT session_id, content_hash FROM tensor_recordings WHERE content_hash IS NOT NULL",
                        (), "list referenced tensor files")
    referenced = {r["content_hash"] for r in rows if r["session_id"] not in expired}
    sizes = {str(p.relative_to(store.root)): p.stat().st_size for p in store.root.glob("??/*") if p.is_file()}
    report = store.gc(db, min_age_s=grace_s, dry_run=dry_run, referenced=referenced)
    return [RemovedFile(str(store.root / rel), int(sizes.get(rel, 0))) for rel in report.removed]


def _optimise(db: Database, dry_run: bool, compact: bool) -> tuple[list[str], int]:
    """Run (or, dry, name) the engine's optimisation; returns the statements and the bytes freed
    (in a dry run, the bytes the free pages hold now)."""
    d = db.dialect
    if dry_run:
        names = ["PRAGMA optimize" if d.name == "sqlite" else "ANALYZE"] + (["VACUUM"] if compact else [])
        return names, db.read(d.reclaimable_bytes, "measure the free pages") if compact else 0
    before = _db_bytes(db.database_path)
    ran = [db.read(d.optimize, "optimise the database")]
    if compact:
        ran.append(db.read(d.compact, "compact the database"))
    return ran, max(0, before - _db_bytes(db.database_path))


def run_maintenance(database: DatabaseLike, *, dry_run: bool = False, older_than_days: float | None = None,
                    config: Mapping[str, object] | None = None, tensor_store: str | os.PathLike[str] | None = None,
                    grace_s: float = 3600.0, compact: bool = True) -> MaintenanceReport:
    """One maintenance pass over ``database`` (see the module docstring); ``dry_run`` changes nothing.

    Args:
        older_than_days: delete finished sessions older than this (default ``config["retention_days"]``).
        config: the framework configuration (DEFAULT_CONFIG's keys).
        tensor_store: the tensor store root (default ``<db dir>/<db name>_tensors``).
        grace_s: files younger than this are never removed (a running session may not have
            referenced them yet).
        compact: also ``VACUUM`` (rewrites the file; ``PRAGMA optimize`` always runs).
    """
    merged = merge_config(config)
    settings = resource_settings(merged)
    owned = not isinstance(database, Database)
    db = Database(database, **database_settings(merged)) if owned else open_database(database)
    try:
        return _maintain(db, dry_run, older_than_days if older_than_days is not None else settings.retention_days,
                         settings, None if tensor_store is None else Path(tensor_store), grace_s, compact)
    finally:
        if owned:  # a database this call opened (a server connection, for a URL) is closed again
            db.close()


def _maintain(db: Database, dry_run: bool, days: float | None, settings: ResourceSettings, tensor_store: Path | None,
              grace_s: float, compact: bool) -> MaintenanceReport:
    """The maintenance pass of :func:`run_maintenance` over an open database."""
    report = MaintenanceReport(database=db.location, dry_run=dry_run)
    report.swept = sweep(db, dry_run=dry_run, legacy_after_s=settings.max_session_duration)
    expired = {str(r["session_id"]) for r in _expired(db, days)}
    report.expired_sessions = sorted(expired)
    if not dry_run:  # rows first: a file is only removed once nothing points at it
        for sid in report.expired_sessions:
            db.sessions.delete(sid)
    keep = {str(r["session_id"]) for r in db.fetch_all("SELECT session_id FROM sessions", (), "list sessions")}
    report.inputs = _session_entries(inputs_dir_of(db.database_path), keep - expired, expired, grace_s, folders=False)
    if not dry_run:
        for f in report.inputs:
            Path(f.path).unlink(missing_ok=True)
    report.artifacts = _session_entries(artifacts_dir_of(db.database_path), keep - expired, expired, grace_s,
                                        folders=True)
    if not dry_run:
        for f in report.artifacts:
            shutil.rmtree(f.path, ignore_errors=True)
    report.tensors = _orphan_tensors(db, tensor_store, expired, grace_s, dry_run)
    report.statements, report.database_bytes_freed = _optimise(db, dry_run, compact)
    return report


@dataclass(frozen=True)
class AutoMaintenance:
    """What an engine start did: the sweep's report and whether the optimisation was due and ran."""

    swept: SweepReport
    optimized: bool


def _claim_due(db: Database, task: str, interval_s: float) -> bool:
    """Atomically record ``task`` as run now when it last ran ``interval_s`` or more ago."""
    now = time.time()

    def do(c: Any) -> bool:
        row = db.execute(c, "SELECT last_run_at FROM maintenance_runs WHERE task = ?", (task,)).fetchone()
        if row is not None and now - float(row[0]) < interval_s:
            return False
        db.execute(c, "INSERT INTO maintenance_runs (task, last_run_at) VALUES (?, ?)"
                      " ON CONFLICT (task) DO UPDATE SET last_run_at = excluded.last_run_at", (task, now))
        return True

    last = db.fetch_one("SELECT last_run_at FROM maintenance_runs WHERE task = ?", (task,), "read maintenance runs")
    if last is not None and now - float(last[0]) < interval_s:
        return False  # the common case decided by a read, no write lock taken
    return db.run_in_transaction(do, f"record the {task} maintenance run")


def auto_maintenance(db: Database, settings: ResourceSettings) -> AutoMaintenance:
    """The cheap maintenance an engine start runs with ``auto_cleanup`` (see the module docstring).

    Best effort: a database that cannot be written now (read-only file, full disk, held locked)
    skips it with a warning on the ``debug_framework`` logger; the engine starts all the same.
    """
    try:
        swept = sweep(db, legacy_after_s=settings.max_session_duration)
        optimized = _claim_due(db, "optimize", settings.maintenance_interval)
        if optimized:
            db.read(db.dialect.optimize, "optimise the database")
    except DebugFrameworkError as exc:
        _LOG.warning("automatic maintenance skipped: %s", exc)
        return AutoMaintenance(swept=SweepReport(), optimized=False)
    return AutoMaintenance(swept=swept, optimized=optimized)
