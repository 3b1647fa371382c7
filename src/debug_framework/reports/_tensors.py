"""Recorded tensors for reports: where they are, summaries, and the error heatmap matrix.

The heatmap of a checkpoint comes from its recorded reference and alternative tensors when the
tensor store has both (``source="recorded tensors"``); otherwise from the worst elements the
comparison core kept in the result row (``source="worst-element list"``), which shows *where* the
k worst elements are, not the whole error field. The report says which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DebugFrameworkError
from ..jsonio import JsonObject, JsonValue
from ..storage.recordings import StoredRecording
from ..storage.tensor_store import TensorStore
from ._common import as_float

if TYPE_CHECKING:
    import numpy as np

    from ..services.validation.results import CheckpointResult

__all__ = ["Heatmap", "open_store", "find_pair", "load_array", "tensor_summary", "heatmap_for",
           "MAX_HEATMAP_ROWS", "MAX_HEATMAP_COLS"]

MAX_HEATMAP_ROWS = 64
MAX_HEATMAP_COLS = 160


@dataclass
class Heatmap:
    checkpoint: str
    layer: int | None
    source: str  # "recorded tensors" | "worst-element list"
    matrix: np.ndarray  # 2-D float64: abs error per (downsampled) cell; inf = non-finite mismatch; NaN = unknown
    full_shape: list[int]
    rows: int  # rows/cols of the 2-D view before downsampling
    cols: int
    block: tuple[int, int]  # elements per cell (rows, cols); each cell shows the block's max
    notes: list[str] = field(default_factory=list)
    #: a worst-element map too sparse to read at full size (logits: k elements among thousands)
    #: is drawn over only the rows and columns that hold a worst element; these are their indices
    #: in the 2-D view (None: the map covers every row and column)
    row_labels: list[int] | None = None
    col_labels: list[int] | None = None


def open_store(store: TensorStore | None, root: str | None) -> TensorStore | None:
    """The given store, or the one at ``root`` if that directory exists (never creates one)."""
    if store is not None:
        return store
    if not root or not Path(root).is_dir():
        return None
    return TensorStore(root, tensor_recording_limit=None)


def find_pair(recordings: Sequence[Mapping[str, JsonValue]], key: tuple[str, int | None]
              ) -> tuple[StoredRecording | None, StoredRecording | None]:
    """The first reference and alternative recording of checkpoint ``key`` that hold their bytes."""
    ref = alt = None
    for rec in (StoredRecording.from_dict(r) for r in recordings):
        if (rec.checkpoint, rec.layer) != key or not rec.content_hash:
            continue
        if rec.side == "reference" and ref is None:
            ref = rec
        elif rec.side == "alternative" and alt is None:
            alt = rec
    return ref, alt


def load_array(store: TensorStore, recording: StoredRecording) -> np.ndarray:
    """The recorded tensor as a float64 NumPy array (hash-verified by the store)."""
    import numpy as np

    t = store.get(str(recording.content_hash))
    if hasattr(t, "detach"):
        t = t.detach().to("cpu")
        if not t.dtype.is_floating_point and not t.dtype.is_complex:
            return t.numpy().astype(np.float64)
        import torch

        return t.to(torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def tensor_summary(recording: Mapping[str, JsonValue], store: TensorStore | None, *, max_values: int = 256) -> JsonObject:
    """Metadata, statistics and (up to ``max_values``) flattened values of one recording."""
    import numpy as np

    rec = StoredRecording.from_dict(recording)
    row = rec.to_dict()
    out: JsonObject = {k: row[k] for k in ("recording_id", "tensor_name", "checkpoint", "layer", "side",
                                           "content_hash", "shape", "dtype", "nbytes", "score")}
    if store is None:
        out["error"] = "tensor store not found"
        return out
    try:
        a = load_array(store, rec)
    except DebugFrameworkError as exc:
        out["error"] = str(exc)
        return out
    flat = a.reshape(-1)
    fin = flat[np.isfinite(flat)]
    out.update(
        numel=int(flat.size),
        nan_count=int(np.isnan(flat).sum()),
        inf_count=int(np.isinf(flat).sum()),
        min=float(fin.min()) if fin.size else None,
        max=float(fin.max()) if fin.size else None,
        mean=float(fin.mean()) if fin.size else None,
        std=float(fin.std()) if fin.size else None,
        abs_max=float(np.abs(fin).max()) if fin.size else None,
        values=[float(v) for v in flat[:max_values]],
        values_truncated=bool(flat.size > max_values),
    )
    return out


def _as_2d_shape(shape: Sequence[int]) -> tuple[int, int]:
    dims = [int(d) for d in shape]
    if not dims:
        return 1, 1
    if len(dims) == 1:
        return 1, dims[0]
    return int(math.prod(dims[:-1])), dims[-1]


def _block_max(mat: np.ndarray, max_rows: int, max_cols: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Downsample by taking each block's max (NaN = unknown is ignored unless the block is all NaN)."""
    import numpy as np

    r, c = mat.shape
    br, bc = max(1, math.ceil(r / max_rows)), max(1, math.ceil(c / max_cols))
    if br == 1 and bc == 1:
        return mat, (1, 1)
    R, C = math.ceil(r / br), math.ceil(c / bc)
    padded = np.full((R * br, C * bc), np.nan)
    padded[:r, :c] = mat
    blocks = padded.reshape(R, br, C, bc).transpose(0, 2, 1, 3).reshape(R, C, br * bc)
    known = ~np.isnan(blocks)
    filled = np.where(known, blocks, -np.inf)
    out = filled.max(axis=2)
    out[~known.any(axis=2)] = np.nan
    return out, (br, bc)


def _from_tensors(ref: np.ndarray, alt: np.ndarray) -> np.ndarray:
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(alt - ref)
    both_nan = np.isnan(ref) & np.isnan(alt)
    same_inf = np.isinf(ref) & np.isinf(alt) & (ref == alt)
    err[both_nan | same_inf] = 0.0
    err[~np.isfinite(err)] = np.inf  # NaN vs number, +inf vs -inf, overflow: a non-finite mismatch
    return err


def heatmap_for(
    row: CheckpointResult,
    recordings: Sequence[Mapping[str, JsonValue]],
    store: TensorStore | None,
    *,
    max_rows: int = MAX_HEATMAP_ROWS,
    max_cols: int = MAX_HEATMAP_COLS,
) -> Heatmap | None:
    """The error heatmap of one checkpoint row (see the module doc for the two sources)."""
    import numpy as np

    key = (row.key.name, row.key.layer)
    notes: list[str] = []
    ref_rec, alt_rec = find_pair(recordings, key)
    if ref_rec is not None and alt_rec is not None:
        if store is None:
            notes.append("tensors were recorded for this checkpoint but the tensor store was not found")
        else:
            try:
                ref, alt = load_array(store, ref_rec), load_array(store, alt_rec)
            except DebugFrameworkError as exc:
                notes.append(f"recorded tensors could not be read: {exc}")
            else:
                if ref.shape != alt.shape:
                    notes.append(f"recorded shapes differ ({list(ref.shape)} vs {list(alt.shape)}); no element-wise map")
                else:
                    r, c = _as_2d_shape(ref.shape)
                    mat, block = _block_max(_from_tensors(ref, alt).reshape(r, c), max_rows, max_cols)
                    return Heatmap(key[0], key[1], "recorded tensors", mat, list(ref.shape), r, c, block, notes)
    elif recordings:
        notes.append("no recorded tensors for this checkpoint (over the recording budget or not enabled)")
    elems = list(row.comparison.worst or [])
    if not elems:
        return None
    stored_shape = row.comparison.reference_shape or row.comparison.alternative_shape
    if not stored_shape or any(len(w.index) != len(stored_shape) for w in elems):
        nd = len(elems[0].index)
        if any(len(w.index) != nd for w in elems):
            return None
        stored_shape = tuple(max(int(w.index[d]) for w in elems) + 1 for d in range(nd))
        notes.append("tensor shape not stored; the map spans the worst elements' bounding box")
    shape = [int(d) for d in stored_shape]
    r, c = _as_2d_shape(shape)
    placed: list[tuple[int, int, float]] = []  # (row, column) in the 2-D view, abs error
    for w in elems:
        idx = [int(i) for i in w.index]
        if any(i < 0 or i >= d for i, d in zip(idx, shape)):
            continue
        if len(shape) <= 1:
            rr, cc = 0, (idx[0] if idx else 0)
        else:
            rr = int(np.ravel_multi_index(idx[:-1], shape[:-1]))
            cc = idx[-1]
        e = as_float(w.abs_error)
        placed.append((rr, cc, math.inf if e is None or math.isnan(e) else e))
    br, bc = max(1, math.ceil(r / max_rows)), max(1, math.ceil(c / max_cols))
    grid = (math.ceil(r / br), math.ceil(c / bc))
    rows_hit = sorted({p[0] for p in placed})
    cols_hit = sorted({p[1] for p in placed})
    if placed and len(rows_hit) * len(cols_hit) < grid[0] * grid[1] / 4:
        # sparse (a vocabulary-wide logits row holds a handful of worst elements): only the rows and
        # columns that hold one, each a whole cell, so the map shows where the error is
        mat = np.full((len(rows_hit), len(cols_hit)), np.nan)
        for rr, cc, e in placed:
            cell = (rows_hit.index(rr), cols_hit.index(cc))
            mat[cell] = e if math.isnan(mat[cell]) else max(mat[cell], e)
        return Heatmap(key[0], key[1], "worst-element list", mat, shape, r, c, (1, 1), notes, rows_hit, cols_hit)
    mat = np.full(grid, np.nan)
    for rr, cc, e in placed:
        cell = (rr // br, cc // bc)
        mat[cell] = e if math.isnan(mat[cell]) else max(mat[cell], e)
    return Heatmap(key[0], key[1], "worst-element list", mat, shape, r, c, (br, bc), notes)
