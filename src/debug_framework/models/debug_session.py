"""``DebugSession``: one validation run of a model on a reference and an alternative backend.

Persistence goes through the session stores of a database
(:class:`~debug_framework.storage.database.Database`; the spec's
:class:`~debug_framework.services.database_manager.DatabaseManager` is one) held by the record
(``db=``) or passed to each call; a database path works too::

    db = DatabaseManager(config["database_path"])
    s = DebugSession(model_path="m.safetensors", reference_backend="python_reference",
                     alternative_backend="pytorch", config={...}, db=db)
    s.save()                                  # inserted with status "created"
    s.update_status("running")
    s.add_checkpoint_result("post_mlp", comparison_result.to_dict())
    s.results = {"verdict": "failed", ...}; s.save()
    s.update_status("failed")
    again = DebugSession.load(s.session_id, db=db)
"""

from __future__ import annotations

import platform
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from types import EllipsisType
from typing import Any

from ..storage.checkpoints import ResultKeys
from ..storage.database import Database, DatabaseLike, open_database
from ._common import format_time, now_utc, parse_time

__all__ = ["DebugSession", "capture_environment"]


def capture_environment(device: str | None = None) -> dict[str, Any]:
    """Python, platform, NumPy/torch versions and the device: the ``environment`` of a session."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "device": device,
    }
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        env["numpy"] = None
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = bool(torch.cuda.is_available())
        if env["cuda_available"] and str(device or "").startswith("cuda"):
            dev = torch.device(str(device))
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            env["gpu"] = torch.cuda.get_device_name(index)
            env["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a dependency
        env["torch"] = None
    return env


_PROVENANCE = (
    "model_path", "weights_digest", "reference_backend", "reference_backend_info", "alternative_backend",
    "alternative_backend_info", "config", "tolerances", "seed", "inputs_ref", "environment", "results",
)


@dataclass(kw_only=True)
class DebugSession:
    """A validation session (attributes as in the spec, plus the provenance the store keeps)."""

    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    model_path: str
    reference_backend: str
    alternative_backend: str
    config: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)
    status: str = "created"
    results: dict[str, Any] | None = None
    weights_digest: str | None = None
    reference_backend_info: dict[str, Any] | None = None
    alternative_backend_info: dict[str, Any] | None = None
    tolerances: dict[str, Any] | None = None
    seed: int | None = None
    inputs_ref: str | None = None
    environment: dict[str, Any] | None = None
    error_message: str | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    db: DatabaseLike | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ dict form

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "model_path": self.model_path,
            "reference_backend": self.reference_backend,
            "alternative_backend": self.alternative_backend,
            "config": self.config,
            "created_at": format_time(self.created_at),
            "status": self.status,
            "results": self.results,
            "weights_digest": self.weights_digest,
            "reference_backend_info": self.reference_backend_info,
            "alternative_backend_info": self.alternative_backend_info,
            "tolerances": self.tolerances,
            "seed": self.seed,
            "inputs_ref": self.inputs_ref,
            "environment": self.environment,
            "error_message": self.error_message,
            "updated_at": format_time(self.updated_at),
            "started_at": format_time(self.started_at),
            "finished_at": format_time(self.finished_at),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, db: DatabaseLike | None = None) -> DebugSession:
        known = {f for f in cls.__dataclass_fields__ if f != "db"}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("created_at", "updated_at", "started_at", "finished_at"):
            if key in kwargs:
                kwargs[key] = parse_time(kwargs[key])
        if kwargs.get("config") is None:
            kwargs["config"] = {}
        if kwargs.get("created_at") is None:
            kwargs.pop("created_at", None)
        return cls(**kwargs, db=db)

    # ------------------------------------------------------------------ persistence

    def _db(self, db: DatabaseLike | None = None) -> Database:
        """The database to use: ``db`` if given (and remembered), else the one the record holds."""
        if db is not None or not isinstance(self.db, Database):
            self.db = open_database(db if db is not None else self.db)
        return self.db

    def save(self, db: DatabaseLike | None = None) -> bool:
        """Insert the session (status ``created``) or update its provenance and ``results``.

        A changed ``status`` is applied through :meth:`update_status` rules (validated transition).
        Everything happens in one transaction.
        """
        sessions = self._db(db).sessions
        with sessions.core.transaction():
            row = sessions.get(self.session_id)
            if row is None:
                sessions.create(
                    self.model_path, self.reference_backend, self.alternative_backend,
                    config=self.config, session_id=self.session_id, weights_digest=self.weights_digest,
                    reference_backend_info=self.reference_backend_info,
                    alternative_backend_info=self.alternative_backend_info, tolerances=self.tolerances,
                    seed=self.seed, inputs_ref=self.inputs_ref, environment=self.environment,
                    created_at=format_time(self.created_at),
                )
                if self.results is not None:
                    sessions.update(self.session_id, results=self.results)
                row = sessions.get(self.session_id)
            else:
                changed = {k: getattr(self, k) for k in _PROVENANCE if getattr(self, k) != row.get(k)}
                if changed:
                    sessions.update(self.session_id, **changed)
            assert row is not None
            if self.status != row["status"]:
                sessions.update_status(self.session_id, self.status, self.error_message)
        self._refresh()
        return True

    @classmethod
    def load(cls, session_id: str, db: DatabaseLike | None = None) -> DebugSession | None:
        """The stored session, or None. ``db``: a DatabaseManager or a database path (required)."""
        database = open_database(db)
        row = database.sessions.get(session_id)
        return None if row is None else cls.from_dict(row, db=database)

    def _refresh(self) -> None:
        row = self._db().sessions.get(self.session_id)
        if row is None:  # pragma: no cover - deleted concurrently
            return
        fresh = DebugSession.from_dict(row)
        for key in ("status", "error_message", "created_at", "updated_at", "started_at", "finished_at"):
            setattr(self, key, getattr(fresh, key))

    def update_status(self, status: str, error_message: str | None = None, *, db: DatabaseLike | None = None) -> bool:
        """Move to ``status`` (created->running|error, running->passed|failed|error), atomically.

        Raises ValidationError for a transition that is not allowed.
        """
        self._db(db).sessions.update_status(self.session_id, status, error_message)
        self._refresh()
        return True

    def add_checkpoint_result(self, checkpoint_name: str, result: dict[str, Any], *,
                              layer: int | None | EllipsisType = ..., db: DatabaseLike | None = None) -> bool:
        """Store one ``ComparisonResult.to_dict()`` under ``checkpoint_name`` (layer from the dict
        unless given). Re-adding the same (checkpoint, layer) replaces the row."""
        keys: ResultKeys = {"checkpoint": checkpoint_name}
        if not isinstance(layer, EllipsisType):
            keys["layer"] = layer
        self._db(db).checkpoints.add_many(self.session_id, [result], **keys)
        return True

    def checkpoint_results(self, db: DatabaseLike | None = None) -> list[dict[str, Any]]:
        """The stored per-(checkpoint, layer) result dicts, in the order they were first written."""
        return self._db(db).checkpoints.for_session(self.session_id)
