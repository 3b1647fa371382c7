"""Per-run artifact directories.

Layout (one directory per run, never reused)::

    <root>/<run_id>/
        manifest.json          every file below, with kind, graph, size and sha256
        fx_graphs/             pre-AOT Dynamo graphs          graph_000.py
        aot_graphs/            ATen graphs after AOTAutograd  graph_000_forward.py, graph_000_backward.py
        inductor_ir/           Inductor IR + FX it lowered    graph_000_forward/ir_pre_fusion.txt ...
        inductor_kernels/      generated code                 graph_000_forward/output_code.py, <kernel>.cpp
        reports/               constraint reports             graph_000_forward.constraints.json, run.json
        statistics/            graph statistics               graph_000_forward.json
        repros/                verified repros (written by the minifier)

``run_id`` is ``<UTC yyyymmddThhmmss>-<8 hex>``; the directory is created with ``exist_ok=False``.
``manifest.json`` (schema ``debug_module.run/1``)::

    {"schema": "debug_module.run/1", "run_id": ..., "created": ISO-8601, "backend": ..., "torch": ...,
     "status": "running" | "complete" | "failed", "files": [{"path": "aot_graphs/graph_000_forward.py",
     "kind": "aot_graph", "graph": "graph_000_forward", "bytes": 123, "sha256": "..."}, ...],
     "graphs": [{"name": "graph_000_forward", ...summary...}], "info": {...}}
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import threading
import uuid
from pathlib import Path
import torch

from debug_framework.jsonio import JsonObject, JsonValue

__all__ = ["RunDirectory", "SUBDIRS", "MANIFEST_SCHEMA", "new_run_id", "DEFAULT_ARTIFACT_ROOT"]

SUBDIRS = ("fx_graphs", "aot_graphs", "inductor_ir", "inductor_kernels", "reports", "statistics", "repros")
MANIFEST_SCHEMA = "debug_module.run/1"
#: CLI-facing default; library code always takes the root as a parameter.
DEFAULT_ARTIFACT_ROOT = "./debug_artifacts"


def new_run_id() -> str:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{uuid.uuid4().hex[:8]}"


class RunDirectory:
    """A fresh run directory under ``root`` with a manifest kept current after every write."""

    def __init__(self, root: str | os.PathLike[str], *, backend: str = "debug_module", info: JsonObject | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            self.run_id = new_run_id()
            self.path = self.root / self.run_id
            try:
                self.path.mkdir(exist_ok=False)
                break
            except FileExistsError:  # pragma: no cover - 32 random bits plus a timestamp
                continue
        for sub in SUBDIRS:
            (self.path / sub).mkdir()
        self._lock = threading.Lock()
        self.manifest: JsonObject = {
            "schema": MANIFEST_SCHEMA,
            "run_id": self.run_id,
            "created": _dt.datetime.now(_dt.UTC).isoformat(),
            "backend": backend,
            "torch": torch.__version__,
            "status": "running",
            "files": [],
            "graphs": [],
            "info": dict(info or {}),
        }
        self._write_manifest()

    @classmethod
    def open(cls, run_path: str | os.PathLike[str]) -> RunDirectory:
        """An existing run directory (its manifest read from disk), to add files to it."""
        self = cls.__new__(cls)
        self.path = Path(run_path)
        self.root = self.path.parent
        self.manifest = cls.load_manifest(self.path)
        self.run_id = self.manifest["run_id"]
        self._lock = threading.Lock()
        return self

    # ------------------------------------------------------------------ writing

    def record(self, rel: str, kind: str, graph: str | None = None) -> Path:
        """Add (or refresh) the manifest entry of a file something else wrote at ``<run>/<rel>``."""
        full = self.path / rel
        data = full.read_bytes()
        entry = {"path": rel, "kind": kind, "graph": graph, "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
        with self._lock:
            self.manifest["files"] = [f for f in self.manifest["files"] if f["path"] != rel] + [entry]
            self._write_manifest()
        return full

    def _target(self, rel: str) -> Path:
        full = (self.path / rel).resolve()
        if self.path.resolve() not in full.parents:
            raise ValueError(f"artifact path {rel!r} escapes the run directory")
        full.parent.mkdir(parents=True, exist_ok=True)
        return full

    def record_tree(self, rel_dir: str, kind: str, graph: str | None = None) -> list[Path]:
        """Record every file under ``<run>/<rel_dir>`` (e.g. a repro directory the minifier wrote)."""
        base = self.path / rel_dir
        return [self.record(f.relative_to(self.path).as_posix(), kind, graph)
                for f in sorted(base.rglob("*")) if f.is_file()]

    def write_text(self, rel: str, text: str, *, kind: str, graph: str | None = None) -> Path:
        self._target(rel).write_text(text, encoding="utf-8")
        return self.record(rel, kind, graph)

    def write_json(self, rel: str, data: JsonValue, *, kind: str, graph: str | None = None) -> Path:
        return self.write_text(rel, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", kind=kind, graph=graph)

    def copy_in(self, src: str | os.PathLike[str], rel: str, *, kind: str, graph: str | None = None) -> Path:
        shutil.copyfile(src, self._target(rel))
        return self.record(rel, kind, graph)

    def add_graph(self, summary: JsonObject) -> None:
        with self._lock:
            self.manifest["graphs"].append(summary)
            self._write_manifest()

    def set_status(self, status: str, **info: JsonValue) -> None:
        with self._lock:
            self.manifest["status"] = status
            self.manifest["info"].update(info)
            self._write_manifest()

    def scratch_dir(self, name: str) -> Path:
        """A private working directory inside the run (not in the manifest; remove it when done)."""
        p = self.path / ".work" / name
        p.mkdir(parents=True, exist_ok=False)
        return p

    def _write_manifest(self) -> None:
        tmp = self.path / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.path / "manifest.json")

    # ------------------------------------------------------------------ reading

    @staticmethod
    def load_manifest(run_path: str | os.PathLike[str]) -> JsonObject:
        return json.loads((Path(run_path) / "manifest.json").read_text(encoding="utf-8"))

    def files(self, kind: str | None = None) -> list[str]:
        return [f["path"] for f in self.manifest["files"] if kind is None or f["kind"] == kind]

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"
