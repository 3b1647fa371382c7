"""``ValidationCheckpoint``: the comparison at one ``(checkpoint, layer)`` of a session."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..capture.keys import CapturedTensor
from ..checkpoint_ids import checkpoint_id
from ..jsonio import JsonObject
from ..storage.database import DatabaseLike, open_database
from ._common import format_time, now_utc, parse_time

__all__ = ["ValidationCheckpoint"]


def _tensor_summary(t: CapturedTensor | None) -> JsonObject | None:
    if t is None:
        return None
    shape = getattr(t, "shape", None)
    return {"shape": None if shape is None else [int(s) for s in shape], "dtype": str(getattr(t, "dtype", type(t).__name__))}


@dataclass(kw_only=True)
class ValidationCheckpoint:
    """Spec attributes plus ``layer``. ``reference_tensor``/``alternative_tensor`` are kept in
    memory only (the database stores the metrics; tensors go through the tensor store)."""

    session_id: str
    checkpoint_name: str
    layer: int | None = None
    comparison_result: JsonObject = field(default_factory=dict)
    reference_tensor: CapturedTensor | None = field(default=None, repr=False, compare=False)
    alternative_tensor: CapturedTensor | None = field(default=None, repr=False, compare=False)
    timestamp: datetime = field(default_factory=now_utc)
    checkpoint_id: str = ""

    def __post_init__(self) -> None:
        if not self.checkpoint_id:  # unique across sessions: the session, then the checkpoint's canonical id
            self.checkpoint_id = f"{self.session_id}/{checkpoint_id(self.checkpoint_name, self.layer)}"

    @property
    def passed(self) -> bool | None:
        p = self.comparison_result.get("passed")
        return None if p is None else bool(p)

    def to_dict(self) -> JsonObject:
        return {
            "checkpoint_id": self.checkpoint_id, "session_id": self.session_id,
            "checkpoint_name": self.checkpoint_name, "layer": self.layer,
            "comparison_result": dict(self.comparison_result),
            "reference_tensor": _tensor_summary(self.reference_tensor),
            "alternative_tensor": _tensor_summary(self.alternative_tensor),
            "timestamp": format_time(self.timestamp),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ValidationCheckpoint:
        return cls(
            checkpoint_id=str(data.get("checkpoint_id") or ""), session_id=data["session_id"],
            checkpoint_name=data["checkpoint_name"], layer=data.get("layer"),
            comparison_result=dict(data.get("comparison_result") or {}),
            timestamp=parse_time(data.get("timestamp")) or now_utc(),
        )

    def save(self, db: DatabaseLike) -> bool:
        open_database(db).checkpoints.add_many(self.session_id, [self.comparison_result],
                                              checkpoint=self.checkpoint_name, layer=self.layer)
        return True

    @classmethod
    def for_session(cls, session_id: str, db: DatabaseLike) -> list[ValidationCheckpoint]:
        """The session's checkpoints in model order, rebuilt from the stored rows."""
        out = []
        for row in open_database(db).checkpoints.for_session(session_id):
            result = {k: v for k, v in row.items() if k not in ("id", "session_id", "created_at", "updated_at")}
            out.append(cls(session_id=session_id, checkpoint_name=row["checkpoint"], layer=row["layer"],
                           comparison_result=result, timestamp=parse_time(row["updated_at"]) or now_utc()))
        return out
