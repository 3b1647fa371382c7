"""Content-addressed tensor store: safetensors files named by the sha256 of their bytes.

Layout under a configurable root (by default next to the database, see
:meth:`TensorStore.beside_database`)::

    <root>/ab/ab12...ef.safetensors      one tensor per file, key "tensor"

* The same tensor content is stored once (deduplicated) however many recordings point at it.
* Files are written to a temporary name and renamed into place, so a reader never sees half a
  file, and two processes writing the same content at once both succeed.
* Reads verify the sha256, so a damaged file is reported, never silently used.
* :meth:`TensorStore.record_session` applies the recording budget (``tensor_recording_limit``
  recordings and ``byte_budget`` bytes per session): checkpoints are ranked by a score the caller
  gives (e.g. max abs error; NaN ranks worst), the worst are kept with their reference and
  alternative tensors together, and the rest are reported in ``RecordingOutcome.dropped``.
* :meth:`TensorStore.gc` removes files no recording references (after a grace period, so a file
  another process has just written but not yet referenced is left alone).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..jsonio import JsonObject
from ..capture.spill import tensor_nbytes
from ..checkpoint_ids import checkpoint_id
from ..errors import ConfigurationError, DatabaseError, no_space_error
from .database import Database
from .recordings import StoredRecording

__all__ = [
    "TensorStore",
    "StoredTensor",
    "RecordingCandidate",
    "DroppedRecording",
    "RecordingOutcome",
    "GarbageCollectionReport",
    "select_within_budget",
]

_SUFFIX = ".safetensors"
_TENSOR_KEY = "tensor"


def _to_cpu_tensor(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").contiguous()
    try:
        arr = np.ascontiguousarray(np.asarray(value))
        return torch.from_numpy(arr.copy())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot record a value of type {type(value).__name__} as a tensor: {exc}",
            hint="pass a torch.Tensor or a NumPy array of a numeric dtype",
        ) from exc


def _nbytes(value: Any) -> int:
    n = tensor_nbytes(value)
    if n is not None:
        return n
    import numpy as np

    return int(np.asarray(value).nbytes)


@dataclass(frozen=True)
class StoredTensor:
    """Where a tensor went: its content hash, file, shape, dtype, size, and whether it was new."""

    content_hash: str
    path: Path
    relpath: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    deduplicated: bool


@dataclass
class RecordingCandidate:
    """A tensor the engine would like to keep for one ``(checkpoint, layer, side)``.

    ``score`` ranks checkpoints for the budget: higher is worse (kept first); NaN counts as worst.
    """

    checkpoint: str
    layer: int | None
    side: str
    tensor: Any
    score: float | None = None
    tensor_name: str | None = None
    metadata: JsonObject = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensor)

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.checkpoint, self.layer)


@dataclass(frozen=True)
class DroppedRecording:
    checkpoint: str
    layer: int | None
    side: str
    score: float | None
    nbytes: int
    reason: str

    def to_dict(self) -> JsonObject:
        return {"checkpoint": self.checkpoint, "layer": self.layer, "side": self.side, "score": self.score,
                "nbytes": self.nbytes, "reason": self.reason}


@dataclass
class RecordingOutcome:
    """What :meth:`TensorStore.record_session` kept (as stored recordings) and what it dropped."""

    kept: list[StoredRecording]
    dropped: list[DroppedRecording]
    kept_bytes: int

    def summary(self) -> str:
        if not self.dropped:
            return f"kept all {len(self.kept)} recordings ({self.kept_bytes} bytes)"
        keys = sorted({(d.checkpoint, d.layer) for d in self.dropped}, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
        names = ", ".join(checkpoint_id(c, lay) for c, lay in keys[:10])
        more = "" if len(keys) <= 10 else f" and {len(keys) - 10} more"
        return (f"kept {len(self.kept)} recordings ({self.kept_bytes} bytes); dropped {len(self.dropped)} "
                f"over budget: {names}{more}")

    def to_dict(self) -> JsonObject:
        return {"kept": [r.to_dict() for r in self.kept], "dropped": [d.to_dict() for d in self.dropped],
                "kept_bytes": self.kept_bytes}


@dataclass(frozen=True)
class GarbageCollectionReport:
    removed: list[str]
    freed_bytes: int
    kept_files: int


def _rank(score: float | None) -> float:
    if score is None:
        return -math.inf
    f = float(score)
    return math.inf if math.isnan(f) else f


def select_within_budget(
    candidates: Sequence[RecordingCandidate],
    *,
    max_recordings: int | None,
    max_bytes: int | None,
) -> tuple[list[RecordingCandidate], list[DroppedRecording]]:
    """Choose which candidates to keep: worst checkpoints first, sides of a checkpoint together.

    Checkpoints are ranked by the highest score of their candidates (NaN = worst, None = best);
    ties keep the caller's order. A checkpoint is kept whole if it still fits both the recording
    count and the byte budget; otherwise all its candidates are dropped with the reason.
    """
    if max_recordings is not None and max_recordings < 0:
        raise ConfigurationError(f"tensor_recording_limit must be >= 0, got {max_recordings}")
    if max_bytes is not None and max_bytes < 0:
        raise ConfigurationError(f"the tensor byte budget must be >= 0, got {max_bytes}")
    groups: dict[tuple[str, int | None], list[RecordingCandidate]] = {}
    for c in candidates:
        groups.setdefault(c.key, []).append(c)
    order = sorted(
        enumerate(groups.items()),
        key=lambda item: (-max(_rank(c.score) for c in item[1][1]), item[0]),
    )
    kept: list[RecordingCandidate] = []
    dropped: list[DroppedRecording] = []
    count = used = 0
    for _, (_key, members) in order:
        size = sum(m.nbytes for m in members)
        reason = None
        if max_recordings is not None and count + len(members) > max_recordings:
            reason = f"tensor_recording_limit of {max_recordings} recordings reached"
        elif max_bytes is not None and used + size > max_bytes:
            reason = f"byte budget of {max_bytes} bytes would be exceeded ({used} used, {size} more needed)"
        if reason is None:
            kept.extend(members)
            count += len(members)
            used += size
        else:
            dropped.extend(DroppedRecording(m.checkpoint, m.layer, m.side, m.score, m.nbytes, reason) for m in members)
    return kept, dropped


class TensorStore:
    """Content-addressed safetensors files under ``root``.

    Args:
        root: directory of the store (created if missing).
        tensor_recording_limit: most recordings kept per session (``config["tensor_recording_limit"]``);
            None for no limit.
        byte_budget: most bytes of tensor data kept per session; None for no limit.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        tensor_recording_limit: int | None = 100,
        byte_budget: int | None = None,
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.tensor_recording_limit = tensor_recording_limit
        self.byte_budget = byte_budget
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            full = no_space_error(exc, "create the tensor store directory", path=str(self.root))
            if full is not None:
                raise full from exc
            raise DatabaseError(f"cannot create the tensor store directory: {exc}", path=str(self.root),
                                hint="choose a writable tensor store root") from exc

    @staticmethod
    def root_beside(database_path: str | os.PathLike[str]) -> Path:
        """Where the store of a database file lives: ``<db dir>/<db name>_tensors/`` (nothing created)."""
        p = Path(database_path).expanduser().resolve()
        return p.parent / f"{p.stem}_tensors"

    @classmethod
    def beside_database(cls, database_path: str | os.PathLike[str], *, tensor_recording_limit: int | None = 100,
                        byte_budget: int | None = None) -> TensorStore:
        """The store for a database file: ``<db dir>/<db name>_tensors/`` (created if missing)."""
        return cls(cls.root_beside(database_path), tensor_recording_limit=tensor_recording_limit,
                   byte_budget=byte_budget)

    def __repr__(self) -> str:
        return f"TensorStore({str(self.root)!r})"

    # ---------------------------------------------------------------- files

    def relpath_for(self, content_hash: str) -> str:
        if len(content_hash) != 64 or any(ch not in "0123456789abcdef" for ch in content_hash):
            raise ConfigurationError(f"{content_hash!r} is not a sha256 hex digest", hint="use the hash put() returned")
        return f"{content_hash[:2]}/{content_hash}{_SUFFIX}"

    def path_for(self, content_hash: str) -> Path:
        return self.root / self.relpath_for(content_hash)

    def exists(self, content_hash: str) -> bool:
        return self.path_for(content_hash).is_file()

    def put(self, tensor: Any) -> StoredTensor:
        """Store one tensor (torch or NumPy); returns where. Identical content is stored once."""
        from safetensors.torch import save

        t = _to_cpu_tensor(tensor)
        data = save({_TENSOR_KEY: t})
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(digest)
        shape = tuple(int(s) for s in t.shape)
        dtype = str(t.dtype).removeprefix("torch.")
        nbytes = int(t.numel()) * int(t.element_size())
        rel = self.relpath_for(digest)
        if path.is_file() and path.stat().st_size == len(data):
            with contextlib.suppress(OSError):  # reused now: the gc's grace period protects it again
                os.utime(path)
            return StoredTensor(digest, path, rel, shape, dtype, nbytes, deduplicated=True)
        tmp_name = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp_name, path)  # atomic; a concurrent writer of the same content is harmless
            tmp_name = None
        except OSError as exc:
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass
            full = no_space_error(exc, f"record a tensor of {len(data)} bytes", path=str(path),
                                  hint="free disk space, lower tensor_recording_limit or the byte budget; "
                                       "recorded data is kept")
            if full is not None:
                raise full from exc
            raise DatabaseError(f"cannot write tensor file: {exc}", path=str(path),
                                hint="check the tensor store root is writable") from exc
        return StoredTensor(digest, path, rel, shape, dtype, nbytes, deduplicated=False)

    def read_bytes(self, content_hash: str, *, verify: bool = True) -> bytes:
        """The safetensors bytes of a stored tensor, checked against its hash."""
        path = self.path_for(content_hash)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise DatabaseError(f"tensor {content_hash} is not in the store", path=str(path),
                                hint="it was dropped by the budget or garbage-collected; re-run with recording on") from exc
        except OSError as exc:
            raise DatabaseError(f"cannot read tensor file: {exc}", path=str(path)) from exc
        if verify and hashlib.sha256(data).hexdigest() != content_hash:
            raise DatabaseError("tensor file is damaged: its sha256 does not match its name", path=str(path),
                                hint="delete the file and re-run the session to record it again")
        return data

    def get(self, content_hash: str, *, verify: bool = True) -> Any:
        """Load a stored tensor as a CPU ``torch.Tensor``."""
        from safetensors.torch import load

        return load(self.read_bytes(content_hash, verify=verify))[_TENSOR_KEY]

    def files(self) -> list[Path]:
        return sorted(self.root.glob(f"??/*{_SUFFIX}"))

    def disk_usage(self) -> tuple[int, int]:
        """(number of tensor files, total bytes) currently in the store."""
        files = [p for p in self.files() if not p.name.startswith(".tmp-")]
        return len(files), sum(p.stat().st_size for p in files)

    # ---------------------------------------------------------------- sessions

    def record_session(
        self,
        db: Database,
        session_id: str,
        candidates: Iterable[RecordingCandidate],
        *,
        tensor_recording_limit: int | None | object = ...,
        byte_budget: int | None | object = ...,
    ) -> RecordingOutcome:
        """Apply the budget to ``candidates``, store the kept tensors and reference them from the
        database (all rows in one transaction). Returns what was kept and what was dropped (why).

        ``tensor_recording_limit``/``byte_budget`` override the store's defaults for this call.
        """
        limit = self.tensor_recording_limit if tensor_recording_limit is ... else tensor_recording_limit
        budget = self.byte_budget if byte_budget is ... else byte_budget
        kept, dropped = select_within_budget(list(candidates), max_recordings=limit, max_bytes=budget)  # type: ignore[arg-type]
        if kept and db.sessions.get(session_id) is None:
            raise DatabaseError(f"session {session_id!r} does not exist", session=session_id,
                                hint="create the session before recording its tensors")
        recordings: list[StoredRecording] = []
        for cand in kept:
            stored = self.put(cand.tensor)
            layer_part = "" if cand.layer is None else f".{cand.layer}"
            recordings.append(StoredRecording(
                session_id=session_id,
                tensor_name=cand.tensor_name or f"{cand.checkpoint}{layer_part}.{cand.side}",
                checkpoint=cand.checkpoint,
                layer=cand.layer,
                side=cand.side,
                content_hash=stored.content_hash,
                shape=list(stored.shape),
                dtype=stored.dtype,
                nbytes=stored.nbytes,
                path=stored.relpath,
                score=None if cand.score is None else float(cand.score),
                metadata=dict(cand.metadata),
            ))
        db.recordings.add_many([rec.to_row() for rec in recordings])  # one transaction
        return RecordingOutcome(kept=recordings, dropped=dropped, kept_bytes=sum(r.nbytes or 0 for r in recordings))

    def gc(self, db: Database | Sequence[Database], *, min_age_s: float = 3600.0, dry_run: bool = False,
           referenced: set[str] | None = None) -> GarbageCollectionReport:
        """Delete tensor files no recording in ``db`` references and stale temporary files.

        Only files older than ``min_age_s`` are touched, so a tensor written by a running session
        whose rows are not committed yet survives. Pass every database that shares this store.
        ``dry_run`` lists what would go and deletes nothing; ``referenced`` replaces the hashes read
        from ``db`` (maintenance passes those of the sessions it keeps).
        """
        dbs = [db] if not isinstance(db, Sequence) else list(db)
        if referenced is None:
            referenced = set()
            for d in dbs:
                referenced |= d.recordings.referenced_content_hashes()
        now = time.time()
        removed, freed, kept = [], 0, 0
        for path in sorted(self.root.glob("??/*")):
            if not path.is_file():
                continue
            is_tmp = path.name.startswith(".tmp-")
            digest = path.name[: -len(_SUFFIX)] if path.name.endswith(_SUFFIX) else None
            if not is_tmp and digest is None:
                continue  # not ours
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if (is_tmp or digest not in referenced) and now - st.st_mtime >= min_age_s:
                try:
                    if not dry_run:
                        path.unlink()
                except FileNotFoundError:
                    continue
                removed.append(str(path.relative_to(self.root)))
                freed += st.st_size
            elif not is_tmp:
                kept += 1
        return GarbageCollectionReport(removed=removed, freed_bytes=freed, kept_files=kept)
