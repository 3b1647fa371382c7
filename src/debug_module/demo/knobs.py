"""The tour's knobs: what the user may change between steps, each checked before anything runs.

A bad value is a :class:`~debug_framework.errors.ConfigurationError` (DF005) naming the knob, its
accepted range and, for a misspelt knob name, the closest one: exit 2 from the command line, a
message and a new prompt in interactive mode.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import TypeAlias

from debug_framework.errors import ConfigurationError
from debug_framework.suggest import did_you_mean

__all__ = ["TourKnobs", "KNOB_HELP", "MAX_SEQ", "parse_assignments"]

#: The tiny model's position table: the longest sequence it takes.
MAX_SEQ = 32
#: What a knob holds once parsed: a count, a tolerance (None: the default), a switch, op names or text.
KnobValue: TypeAlias = int | float | bool | tuple[str, ...] | str | None
_OP = re.compile(r"[A-Za-z_][\w.]*\Z")  # with fullmatch: \Z, not $, so a final newline is refused
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}

#: One line per knob: what it changes (shown by the interactive prompt and ``--help``).
KNOB_HELP: dict[str, str] = {
    "batch": "rows per batch (1..64)",
    "seq": f"tokens per row (2..{MAX_SEQ})",
    "padding": "padded (masked) tokens at the end of the last row (0..seq-1)",
    "alignment": "constraint: every tensor dim a multiple of this (>= 1; 1 = off)",
    "deny_ops": "constraint: ATen ops the accelerator lacks, comma separated (e.g. aten.tanh.default)",
    "rtol": "KernelDiff relative tolerance (>= 0; default: none, the float64 ratio rule judges)",
    "atol": "KernelDiff absolute tolerance (>= 0; default: none, the float64 ratio rule judges)",
    "force_failure": "minifier step: force a strict-mode failure (yes/no)",
    "fail_op": "the op the forced failure denies (the minifier reduces the graph to it)",
    "runs": "benchmark: timed calls per side (1..1000)",
}


@dataclass(frozen=True)
class TourKnobs:
    """The settings every step reads. Build changed copies with :meth:`changed`."""

    batch: int = 2
    seq: int = 8
    padding: int = 3
    alignment: int = 8
    deny_ops: tuple[str, ...] = ()
    rtol: float | None = None
    atol: float | None = None
    force_failure: bool = True
    fail_op: str = "aten.tanh.default"
    runs: int = 10

    def __post_init__(self) -> None:
        _int_in("batch", self.batch, 1, 64)
        _int_in("seq", self.seq, 2, MAX_SEQ)
        _int_in("padding", self.padding, 0, self.seq - 1)
        _int_in("alignment", self.alignment, 1, 1 << 20)
        _int_in("runs", self.runs, 1, 1000)
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise _bad(name, value)
        for op in (*self.deny_ops, self.fail_op):
            if not _OP.fullmatch(op):
                raise ConfigurationError(f"{op!r} is not an op name", knob="deny_ops" if op in self.deny_ops else "fail_op",
                                         hint="write ATen ops as aten.<name>.<overload>, e.g. aten.tanh.default")

    def changed(self, changes: dict[str, str]) -> TourKnobs:
        """A copy with ``changes`` (knob name -> text as typed) applied, each parsed and checked."""
        known = [f.name for f in fields(self)]
        parsed: dict[str, KnobValue] = {}
        for name, text in changes.items():
            key = name.strip().replace("-", "_")
            if key not in known:
                raise ConfigurationError(f"unknown knob {name!r}" + did_you_mean(key, known), hint="knobs: " + ", ".join(known))
            parsed[key] = _parse(key, text.strip())
        return replace(self, **parsed)

    def as_dict(self) -> dict[str, KnobValue]:
        """The knobs as plain data (for the artifacts and the printed table)."""
        return asdict(self)


def parse_assignments(line: str) -> dict[str, str]:
    """``"batch=4 padding=0"`` -> ``{"batch": "4", "padding": "0"}``; DF005 for a word without ``=``."""
    out: dict[str, str] = {}
    for word in line.split():
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise ConfigurationError(f"{word!r} is not knob=value", hint="for example: batch=4 padding=0 alignment=1")
        out[name] = value
    return out


def _parse(name: str, text: str) -> KnobValue:
    kind = {"batch": int, "seq": int, "padding": int, "alignment": int, "runs": int, "rtol": float, "atol": float}
    if name in kind:
        if name in ("rtol", "atol") and text.lower() in ("", "none", "default"):
            return None
        try:
            return kind[name](text)
        except ValueError:
            raise _bad(name, text) from None
    if name == "force_failure":
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise _bad(name, text)
    if name == "deny_ops":
        return tuple(op.strip() for op in text.split(",") if op.strip())
    return text


def _int_in(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"{name}={value} is out of range: {KNOB_HELP[name]}", knob=name,
                                 hint=f"give an integer from {low} to {high}")


def _bad(name: str, value: object) -> ConfigurationError:
    return ConfigurationError(f"{name}={value} is not valid: {KNOB_HELP[name]}", knob=name,
                              hint="debug-tour --help lists every knob")
