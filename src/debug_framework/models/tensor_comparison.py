"""``TensorComparison``: the verdict on one pair of recorded tensors."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..jsonio import JsonObject
from ..storage.database import DatabaseLike, open_database
from ._common import format_time, now_utc, parse_time

__all__ = ["TensorComparison"]


@dataclass(kw_only=True)
class TensorComparison:
    comparison_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    reference_recording_id: str | None
    alternative_recording_id: str | None
    match_status: bool
    max_absolute_error: float | None = None
    max_relative_error: float | None = None
    tolerance_config: JsonObject = field(default_factory=dict)
    checkpoint: str | None = None
    layer: int | None = None
    metrics: JsonObject = field(default_factory=dict)
    created_at: datetime = field(default_factory=now_utc)

    @classmethod
    def from_comparison_result(
        cls, session_id: str, result: Mapping[str, object], *, reference_recording_id: str | None = None,
        alternative_recording_id: str | None = None,
    ) -> TensorComparison:
        """Build from a ``ComparisonResult.to_dict()``."""
        return cls(
            session_id=session_id, reference_recording_id=reference_recording_id,
            alternative_recording_id=alternative_recording_id, match_status=bool(result.get("passed")),
            max_absolute_error=result.get("max_abs_error"), max_relative_error=result.get("max_rel_error"),
            tolerance_config=dict(result.get("tolerance") or {}), checkpoint=result.get("checkpoint"),
            layer=result.get("layer"), metrics=dict(result),
        )

    def to_dict(self) -> JsonObject:
        return {
            "comparison_id": self.comparison_id, "session_id": self.session_id,
            "reference_recording_id": self.reference_recording_id,
            "alternative_recording_id": self.alternative_recording_id, "match_status": self.match_status,
            "max_absolute_error": self.max_absolute_error, "max_relative_error": self.max_relative_error,
            "tolerance_config": dict(self.tolerance_config), "checkpoint": self.checkpoint, "layer": self.layer,
            "metrics": dict(self.metrics), "created_at": format_time(self.created_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TensorComparison:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["created_at"] = parse_time(kwargs.get("created_at")) or now_utc()
        kwargs["tolerance_config"] = kwargs.get("tolerance_config") or {}
        kwargs["metrics"] = kwargs.get("metrics") or {}
        return cls(**kwargs)

    def save(self, db: DatabaseLike) -> bool:
        open_database(db).recordings.add_comparison(self.to_dict())
        return True

    @classmethod
    def for_session(cls, session_id: str, db: DatabaseLike) -> list[TensorComparison]:
        return [cls.from_dict(r) for r in open_database(db).recordings.comparisons_for_session(session_id)]
