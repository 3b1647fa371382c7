"""Nested outputs: flatten dicts, lists, tuples, dataclasses and HF ``ModelOutput`` to named leaves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ComparisonError
from ._inputs import is_tensor
from .engine import compare
from .result import ComparisonResult, NestedComparison
from .tolerance import Tolerance

__all__ = ["flatten_outputs", "compare_nested"]

_LEAF = (np.ndarray, np.generic, bool, int, float)  #: and torch tensors (:func:`is_tensor`)


def flatten_outputs(obj: object, prefix: str = "") -> dict[str, object]:
    """Named leaves of a nested output: ``{"logits": t, "hidden_states.3": t, ...}``.

    Mappings (HF ``ModelOutput`` included) by key, sequences by position, dataclasses and
    named tuples by field. ``None`` entries are skipped (HF outputs leave unused fields ``None``).
    A lone tensor flattens to ``{"output": t}`` (or ``{prefix: t}``).
    """
    out: dict[str, object] = {}

    def name(key: object) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    if obj is None:
        return out
    if isinstance(obj, _LEAF) or is_tensor(obj):
        out[prefix or "output"] = obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten_outputs(v, name(k)))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out.update(flatten_outputs(getattr(obj, f.name), name(f.name)))
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for f in obj._fields:
            out.update(flatten_outputs(getattr(obj, f), name(f)))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(flatten_outputs(v, name(i)))
    else:
        raise ComparisonError(
            f"output leaf {prefix or '<root>'!r} is a {type(obj).__name__}, which cannot be compared",
            hint="return tensors (or dicts/lists/tuples/dataclasses of tensors) from the model",
        )
    return out


def compare_nested(
    reference: object,
    alternative: object,
    *,
    leaf_tolerance: Mapping[str, Tolerance] | Callable[[str], Tolerance | None] | None = None,
    **kwargs: Any,
) -> NestedComparison:
    """Compare two nested outputs leaf by leaf; missing and extra leaves are reported by name.

    ``leaf_tolerance`` gives a tolerance per leaf name (a mapping, or a function returning ``None``
    for the default); other keyword arguments go to :func:`compare` for every leaf.
    """
    ref = flatten_outputs(reference)
    alt = flatten_outputs(alternative)
    results: dict[str, ComparisonResult] = {}
    for key, r in ref.items():
        if key not in alt:
            continue
        tol = None
        if leaf_tolerance is not None:
            tol = leaf_tolerance.get(key) if isinstance(leaf_tolerance, Mapping) else leaf_tolerance(key)
        kw = dict(kwargs)
        if tol is not None:
            kw["tolerance"] = tol
        results[key] = compare(r, alt[key], name=key, **kw)
    missing = [k for k in ref if k not in alt]
    extra = [k for k in alt if k not in ref]
    return NestedComparison(results=results, missing=missing, extra=extra)
