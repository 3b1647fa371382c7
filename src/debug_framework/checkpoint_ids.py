"""The one spelling of a checkpoint: ``post_attention:1`` (a per-layer checkpoint), ``post_embedding``.

:func:`checkpoint_id` is the only code that builds the canonical id of a checkpoint. It sits in the
core layer and imports nothing heavy, so everything that names a checkpoint reaches it without
torch: the checkpoint keys (``CheckpointKey.__str__``), the reports (JSON, CSV, JUnit, HTML, Model
Explorer), the dashboard, the session diff and the tensor store. ``CheckpointKey.parse`` reads the
id back.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["checkpoint_id", "row_checkpoint_id"]


def checkpoint_id(name: str, layer: int | None = None, step: int | None = None) -> str:
    """``checkpoint_id("post_attention", 1) == "post_attention:1"``; ``checkpoint_id("post_embedding")
    == "post_embedding"`` (a layer-less checkpoint is its name); a decode step, when there is one,
    follows as ``@step`` (``post_mlp:2@5``; the prefill pass has none)."""
    base = name if layer is None else f"{name}:{layer}"
    return base if step is None else f"{base}@{step}"


def row_checkpoint_id(row: Mapping[str, object]) -> str:
    """The canonical id of a stored checkpoint row: its ``id`` when that is one (a non-empty string;
    an older session's rows have none, and the store's integer row number is not one), else
    :func:`checkpoint_id` of its ``checkpoint``, ``layer`` and decode ``step`` (a layer or step that
    is not a number reads as None)."""
    stored = row.get("id")
    if isinstance(stored, str) and stored:
        return stored
    layer = row.get("layer")
    try:
        layer = None if layer is None else int(layer)
    except (TypeError, ValueError):
        layer = None
    step = row.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    return checkpoint_id(str(row.get("checkpoint")), layer, step)
