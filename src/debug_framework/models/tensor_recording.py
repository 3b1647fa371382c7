"""``TensorRecording``: a tensor kept for later analysis, stored in the content-addressed
tensor store and referenced from the database by its sha256 (``content_hash``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ._common import format_time, now_utc, parse_time, resolve_db

if TYPE_CHECKING:
    from ..services.tensor_store import TensorStore

__all__ = ["TensorRecording"]


@dataclass(kw_only=True)
class TensorRecording:
    """One recorded tensor. The bytes live in the tensor store (``path`` is relative to its root);
    ``tensor_data(store)`` reads them back (hash-verified)."""

    recording_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    tensor_name: str
    checkpoint: str | None = None
    layer: int | None = None
    side: str | None = None
    content_hash: str | None = None
    shape: list[int] | None = None
    dtype: str | None = None
    nbytes: int | None = None
    path: str = ""
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)

    def to_dict(self) -> dict[str, Any]:
        return {
            "recording_id": self.recording_id, "session_id": self.session_id, "tensor_name": self.tensor_name,
            "checkpoint": self.checkpoint, "layer": self.layer, "side": self.side,
            "content_hash": self.content_hash, "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype, "nbytes": self.nbytes, "path": self.path, "score": self.score,
            "metadata": dict(self.metadata), "created_at": format_time(self.created_at),
        }

    def to_row(self) -> dict[str, Any]:
        return self.to_dict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorRecording:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["created_at"] = parse_time(kwargs.get("created_at")) or now_utc()
        kwargs["metadata"] = kwargs.get("metadata") or {}
        return cls(**kwargs)

    def save(self, db: Any) -> bool:
        resolve_db(db).add_tensor_recording(self.to_row())
        return True

    @classmethod
    def load(cls, recording_id: str, db: Any) -> TensorRecording | None:
        row = resolve_db(db).get_tensor_recording(recording_id)
        return None if row is None else cls.from_dict(row)

    @classmethod
    def for_session(cls, session_id: str, db: Any) -> list[TensorRecording]:
        return [cls.from_dict(r) for r in resolve_db(db).get_tensor_recordings(session_id)]

    def tensor_data(self, store: TensorStore) -> bytes:
        """The serialized (safetensors) bytes of the tensor, verified against ``content_hash``."""
        if not self.content_hash:
            from ..errors import DatabaseError

            raise DatabaseError("this recording has no content hash", recording=self.recording_id)
        return store.read_bytes(self.content_hash)

    def load_tensor(self, store: TensorStore) -> Any:
        """The tensor itself (CPU ``torch.Tensor``)."""
        if not self.content_hash:
            from ..errors import DatabaseError

            raise DatabaseError("this recording has no content hash", recording=self.recording_id)
        return store.get(self.content_hash)
