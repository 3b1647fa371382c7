"""``TensorRecording``: a tensor kept for later analysis, stored in the content-addressed
tensor store and referenced from the database by its sha256 (``content_hash``).

The fields are those of the ``tensor_recordings`` row
(:class:`~debug_framework.storage.recordings.StoredRecording`, which
:meth:`TensorStore.record_session <debug_framework.storage.tensor_store.TensorStore.record_session>`
returns); this record adds the spec's verbs over the stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..capture.keys import CapturedTensor
from ..errors import DatabaseError
from ..storage.database import DatabaseLike, open_database
from ..storage.recordings import StoredRecording
from ..storage.tensor_store import TensorStore

__all__ = ["TensorRecording"]


@dataclass(kw_only=True)
class TensorRecording(StoredRecording):
    """One recorded tensor. The bytes live in the tensor store (``path`` is relative to its root);
    ``tensor_data(store)`` reads them back (hash-verified)."""

    def save(self, db: DatabaseLike) -> bool:
        open_database(db).recordings.add(self.to_row())
        return True

    @classmethod
    def load(cls, recording_id: str, db: DatabaseLike) -> TensorRecording | None:
        row = open_database(db).recordings.get(recording_id)
        return None if row is None else cls.from_dict(row)

    @classmethod
    def for_session(cls, session_id: str, db: DatabaseLike) -> list[TensorRecording]:
        return [cls.from_dict(r) for r in open_database(db).recordings.for_session(session_id)]

    def _hash(self) -> str:
        if not self.content_hash:
            raise DatabaseError("this recording has no content hash", recording=self.recording_id)
        return self.content_hash

    def tensor_data(self, store: TensorStore) -> bytes:
        """The serialized (safetensors) bytes of the tensor, verified against ``content_hash``."""
        return store.read_bytes(self._hash())

    def load_tensor(self, store: TensorStore) -> CapturedTensor:
        """The tensor itself (CPU ``torch.Tensor``)."""
        return store.get(self._hash())
