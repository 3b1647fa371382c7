"""Stored results in the shape of the version before the typed result, brought up to it once.

Rows written before :class:`~debug_framework.services.validation.results.CheckpointResult` kept a
checkpoint's judgement in a nested ``judgement`` object (its rule under ``calibrated``, the replayed
block's under ``introduced_judgement``) or the ratio rule under ``oracle``; their sessions' isolation
entries kept the MLP side under ``mlp_judgement``. The schema's step to version 8 rewrites them in
the one shape (``judged_by``, ``bound``, ``margin``, ``rule``, ``introduced`` at the top level;
``mlp``), so readers know one shape and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..jsonio import JsonObject, JsonValue

__all__ = ["upgrade_row", "upgrade_summary"]


def _rule(old: Mapping[str, JsonValue]) -> JsonObject:
    """An old ratio-rule record (``alternative_error``, ``reference_error``) as the one ``rule`` shape."""
    return {"metric": old.get("metric"), "error": old.get("alternative_error"),
            "baseline_error": old.get("reference_error"), "multiplier": old.get("multiplier"), "floor": old.get("floor")}


def upgrade_row(doc: Mapping[str, JsonValue]) -> JsonObject | None:
    """A stored checkpoint row's document in the one shape; None when it is in it already."""
    old = doc.get("judgement")
    oracle = doc.get("oracle")
    if not isinstance(old, Mapping) and not (isinstance(oracle, Mapping) and "rule" not in doc):
        return None
    old = old if isinstance(old, Mapping) else {}
    out: JsonObject = {k: v for k, v in doc.items() if k not in ("judgement", "oracle")}
    for key in ("judged_by", "bound", "margin", "reason", "consistent_with"):
        if out.get(key) is None and old.get(key) is not None:
            out[key] = old[key]
    rule = oracle if isinstance(oracle, Mapping) else old.get("calibrated")
    if isinstance(rule, Mapping) and "rule" not in out:
        out["rule"] = _rule(rule)
        out.setdefault("judged_by", "calibration")
    replayed = old.get("introduced_judgement")
    if isinstance(replayed, Mapping) and not isinstance(out.get("introduced"), Mapping):
        out["introduced"] = {"block": replayed.get("block"), "input": "reference",
                             "passed": replayed.get("passed"), "judged_by": replayed.get("judged_by") or "calibration",
                             "bound": replayed.get("bound"), "margin": replayed.get("margin"), "reason": None,
                             "rule": _rule(replayed), "max_abs_error": doc.get("introduced_error"), "rmse": None}
    return out


def upgrade_summary(results: Mapping[str, JsonValue]) -> JsonObject | None:
    """A stored session's ``results`` in the one shape (isolation entries' ``mlp_judgement`` as
    ``mlp``); None when it is in it already."""
    iso = results.get("isolation")
    if not isinstance(iso, list) or not any(isinstance(d, Mapping) and "mlp_judgement" in d for d in iso):
        return None
    layers: list[JsonValue] = []
    for d in iso:
        if isinstance(d, Mapping) and "mlp_judgement" in d:
            entry = {k: v for k, v in d.items() if k != "mlp_judgement"}
            entry.setdefault("mlp", d["mlp_judgement"])
            layers.append(entry)
        else:
            layers.append(d)
    return {**results, "isolation": layers}
