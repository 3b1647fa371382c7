"""Reading a stored checkpoint row's judgement, in the result record's one shape
(``services.validation.results.CheckpointResult.to_dict``) and in the shape rows had before it
(a nested ``judgement`` dict), so sessions stored by earlier versions still render."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import as_float

__all__ = ["judged_by", "rule_of", "replay_of", "layer_replay_of"]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def judged_by(row: Mapping[str, Any]) -> str | None:
    """The rule that judged the row: ``calibration``, ``tolerance``, ``oracle`` or ``isolation``."""
    value = row.get("judged_by") or _mapping(row.get("judgement")).get("judged_by")
    return None if value is None else str(value)


def rule_of(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ratio rule's numbers (``metric``, ``error``, ``baseline_error``, ``multiplier``,
    ``floor``) where one judged the row; None for a tolerance."""
    rule = row.get("rule")
    if isinstance(rule, Mapping):
        return rule
    old = row.get("oracle") if isinstance(row.get("oracle"), Mapping) else _mapping(row.get("judgement")).get("calibrated")
    if not isinstance(old, Mapping):
        return None
    return {"metric": old.get("metric"), "error": old.get("alternative_error"),
            "baseline_error": old.get("reference_error"), "multiplier": old.get("multiplier"), "floor": old.get("floor")}


def replay_of(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The judgement of the block that ends at the row's checkpoint, replayed on the reference's
    input (``passed``, ``judged_by``, ``bound``, ``margin``, ``max_abs_error``, ``rmse``, ``rule``)."""
    intro = row.get("introduced")
    if isinstance(intro, Mapping) and "judged_by" in intro:
        return intro
    old = _mapping(row.get("judgement")).get("introduced_judgement")
    if not isinstance(old, Mapping):
        return None
    return {"passed": old.get("passed"), "margin": old.get("margin"), "bound": old.get("bound"),
            "rule": {"metric": old.get("metric"), "error": old.get("alternative_error")},
            "max_abs_error": as_float(row.get("introduced_error"))}


def layer_replay_of(layer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """An isolation entry's MLP-side judgement (the block ending at post_mlp), new or old shape."""
    for key in ("mlp", "layer_replay", "mlp_judgement"):
        if isinstance(layer.get(key), Mapping):
            return layer[key]
    return None
