"""Suggestions ("did you mean ...?") for names a user types: backends, dtypes, checkpoints, formats, keys.

One helper so every unknown-name error reads the same way and suggests the same way (difflib's
closest matches). Imports nothing heavy: CLIs call it before torch is imported.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean", "one_of"]


def closest(name: object, choices: Iterable[object], *, cutoff: float = 0.6) -> str | None:
    """The choice closest to ``name`` (difflib, case-insensitive), or ``None`` when none is close."""
    options = [str(c) for c in choices]
    lowered = {o.lower(): o for o in options}
    match = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[match[0]] if match else None


def did_you_mean(name: object, choices: Iterable[object]) -> str:
    """``" (did you mean 'x'?)"`` for the closest choice, else ``""``: append it to a message."""
    match = closest(name, choices)
    return "" if match is None else f" (did you mean {match!r}?)"


def one_of(choices: Iterable[object]) -> str:
    """``"use one of a, b, c"``: the usual hint of an unknown-name error."""
    return "use one of " + ", ".join(str(c) for c in choices)
