"""The alternative's quantized modules in the HTML report (section ``quantized``).

A module backend holding torchao-quantized weights lists them as ``quantized_modules`` (each
``{module, scheme, group_size, tensor}``: ``backends.quantized.quantized_modules``): with the
session's alternative backend where the session is judged at that quantization (``--dtype auto``),
and in the precision diagnosis where it is judged at a float dtype; the diagnosis also counts the
quantized operators per scheme (``quantized``). :func:`quantized_section` draws both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ._html import Markup, section, table, tag

if TYPE_CHECKING:
    from ..jsonio import JsonValue
    from ..services.validation.results import ValidationResult
    from ..storage.session_record import SessionRecord

__all__ = ["quantized_modules_of", "quantized_section"]


def _listed(value: JsonValue | None) -> list[Mapping[str, JsonValue]]:
    return [m for m in value if isinstance(m, Mapping)] if isinstance(value, Sequence) and not isinstance(value, str) \
        else []


def quantized_modules_of(result: ValidationResult, session: SessionRecord) -> list[Mapping[str, JsonValue]]:
    """The session's ``quantized_modules``: the precision diagnosis's, else the alternative backend's record."""
    diagnosis = result.precision_diagnosis or {}
    return _listed(diagnosis.get("quantized_modules")) or _listed(session.alternative_backend_info.get("quantized_modules"))


def quantized_section(result: ValidationResult, session: SessionRecord) -> Markup | str:
    """One row per quantized module (module, scheme, group size, tensor class) and the quantized
    operators per scheme; empty where the alternative holds none."""
    modules = quantized_modules_of(result, session)
    operators = (result.precision_diagnosis or {}).get("quantized")
    if not modules and not operators:
        return ""
    parts: list[object] = []
    if isinstance(operators, Mapping) and operators:
        counts = ", ".join(f"{scheme} at {n}" for scheme, n in operators.items())
        parts.append(tag("p", f"quantized operators: {counts}", id="quantized-operators"))
    if modules:
        parts.append(tag("p", f"{len(modules)} quantized module(s) in the alternative:", class_="muted"))
        parts.append(table(["module", "scheme", "group size", "tensor"],
                           ([m.get("module"), m.get("scheme"), "" if m.get("group_size") is None else m.get("group_size"),
                             m.get("tensor")] for m in modules), cls="quantized"))
    return section("quantized", "Quantized modules", *parts)
