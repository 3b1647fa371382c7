from __future__ import annotations

import hashlib
import math
import os
import time

import numpy as np
import pytest
import torch

from debug_framework.errors import DatabaseError, ValidationError
from debug_framework.models.tensor_recording import TensorRecording
from debug_framework.storage.tensor_store import RecordingCandidate, TensorStore, select_within_budget


@pytest.fixture
def store(db_path):
    return TensorStore.beside_database(db_path, tensor_recording_limit=100)


def test_put_get_round_trip_and_content_addressing(store):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    a = store.put(t)
    assert a.path.is_file() and a.path.parent.parent == store.root
    assert a.content_hash == hashlib.sha256(a.path.read_bytes()).hexdigest() == a.path.name.split(".")[0]
    assert (a.shape, a.dtype, a.nbytes, a.deduplicated) == ((3, 4), "float32", 48, False)
    assert torch.equal(store.get(a.content_hash), t)
    b = store.put(t.clone())  # same content: same file, written once
    assert b.content_hash == a.content_hash and b.deduplicated and store.disk_usage()[0] == 1
    c = store.put(t.to(torch.float64))  # same values, other dtype: other content
    assert c.content_hash != a.content_hash
    bf = store.put(torch.randn(5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16))
    assert store.get(bf.content_hash).dtype == torch.bfloat16
    n = store.put(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert store.get(n.content_hash).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValidationError):
        store.put(np.array(["text"], dtype=object))


def test_damaged_or_missing_file_is_reported(store):
    s = store.put(torch.ones(4))
    data = bytearray(s.path.read_bytes())
    data[-1] ^= 0xFF
    s.path.write_bytes(bytes(data))
    with pytest.raises(DatabaseError, match="damaged"):
        store.get(s.content_hash)
    s.path.unlink()
    with pytest.raises(DatabaseError, match="not in the store"):
        store.get(s.content_hash)


def _cands(scores, size=16):
    out = []
    for i, score in enumerate(scores):
        for side in ("reference", "alternative"):
            out.append(RecordingCandidate("post_mlp", i, side, torch.zeros(size // 4), score=score))
    return out


def test_budget_keeps_the_worst_checkpoints_with_both_sides():
    kept, dropped = select_within_budget(_cands([0.1, 5.0, math.nan, 0.3, 2.0]), max_recordings=6, max_bytes=None)
    assert [(c.layer, c.side) for c in kept] == [(2, "reference"), (2, "alternative"), (1, "reference"),
                                                  (1, "alternative"), (4, "reference"), (4, "alternative")]
    assert sorted({d.layer for d in dropped}) == [0, 3]
    assert all("tensor_recording_limit of 6" in d.reason for d in dropped)
    kept, dropped = select_within_budget(_cands([0.1, 5.0, 0.3]), max_recordings=None, max_bytes=64)
    assert {c.layer for c in kept} == {1, 2} and {d.layer for d in dropped} == {0}
    assert "byte budget of 64 bytes" in dropped[0].reason
    kept, dropped = select_within_budget(_cands([1.0]), max_recordings=1, max_bytes=None)
    assert kept == [] and len(dropped) == 2  # a checkpoint is kept whole or not at all
    with pytest.raises(ValidationError):
        select_within_budget([], max_recordings=-1, max_bytes=None)


def test_record_session_stores_kept_and_reports_dropped(db, store):
    sid = db.create_session("m", "python_reference", "pytorch")
    cands = []
    for layer, err in enumerate([1e-7, 3e-2, 1e-6, 0.5]):
        ref = torch.full((4, 8), float(layer))
        cands.append(RecordingCandidate("post_mlp", layer, "reference", ref, score=err))
        cands.append(RecordingCandidate("post_mlp", layer, "alternative", ref + err, score=err))
    out = store.record_session(db, sid, cands, tensor_recording_limit=4)
    assert sorted({r.layer for r in out.kept}) == [1, 3]
    assert sorted({d.layer for d in out.dropped}) == [0, 2]
    assert "dropped 4 over budget: post_mlp:0, post_mlp:2" in out.summary()  # checkpoints by their id
    recs = TensorRecording.for_session(sid, db)
    assert len(recs) == 4 and {r.side for r in recs} == {"reference", "alternative"}
    alt3 = next(r for r in recs if r.layer == 3 and r.side == "alternative")
    assert torch.equal(alt3.load_tensor(store), torch.full((4, 8), 3.0) + 0.5)
    assert alt3.score == 0.5 and alt3.shape == [4, 8] and alt3.nbytes == 128
    assert alt3.tensor_data(store) == (store.root / alt3.path).read_bytes()
    with pytest.raises(DatabaseError, match="does not exist"):
        store.record_session(db, "ghost", cands[:2])
    assert len(db.get_tensor_recordings(sid)) == 4


def test_gc_removes_only_old_unreferenced_files(db, store):
    sid = db.create_session("m", "a", "b")
    keep = store.record_session(db, sid, [RecordingCandidate("post_mlp", 0, "reference", torch.ones(3), 1.0)])
    orphan = store.put(torch.zeros(3))
    fresh_orphan = store.put(torch.full((3,), 2.0))
    old = time.time() - 7200
    for h in (keep.kept[0].content_hash, orphan.content_hash):
        os.utime(store.path_for(h), (old, old))
    report = store.gc(db, min_age_s=3600)
    assert report.removed == [orphan.relpath]
    assert store.exists(keep.kept[0].content_hash) and store.exists(fresh_orphan.content_hash)
    db.delete_session(sid)  # its recordings go with it; the file becomes garbage
    report = store.gc(db, min_age_s=0)
    assert set(report.removed) == {keep.kept[0].path, fresh_orphan.relpath} and store.disk_usage() == (0, 0)
