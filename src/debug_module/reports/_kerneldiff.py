"""What the KernelDiff report shows for one saved result: is it an exact match?

Kept apart from :mod:`debug_module.diff` (which needs torch) so that reading run directories does
not; :class:`~debug_module.diff.report.DiffReport` uses the same test for its ``exact_match``.
"""

from __future__ import annotations

from collections.abc import Mapping

from debug_framework.jsonio import JsonValue

__all__ = ["exact_match_of"]

_NONFINITE = ("nan_count_reference", "nan_count_test", "inf_count_reference", "inf_count_test")


def _is_zero(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def exact_match_of(report: Mapping[str, JsonValue]) -> bool:
    """True when a KernelDiff result (``DiffReport.to_dict()`` or its saved JSON) is bit-identical:
    something was compared, no leaf is missing or extra, and every output, gradient and module passed,
    has the reference's dtype, no error (bit-identical to float32 eager with a float64 reference, max
    abs error 0 otherwise) and no NaN/inf on either side. Then plots of its errors would be all zeros."""
    entries = [e for key in ("outputs", "gradients", "modules") for e in report.get(key) or () if isinstance(e, Mapping)]
    if not entries or report.get("missing") or report.get("extra"):
        return False
    return all(e.get("passed") is not False and _dtypes_match(e) and _no_error(e)
               and not any(e.get(k) for k in _NONFINITE) for e in entries)


def _no_error(entry: Mapping[str, JsonValue]) -> bool:
    """Bit-identical to what it is compared with: with a float64 reference, to float32 eager
    (``identical_to_eager``); else max abs error 0 against the reference."""
    identical = entry.get("identical_to_eager")
    return bool(identical) if identical is not None else _is_zero(entry.get("max_abs_error"))


def _dtypes_match(entry: Mapping[str, JsonValue]) -> bool:
    """The test's dtype is the reference's (eager's, when the reference is float64): equal values in
    another dtype are no exact match."""
    test = (entry.get("comparison") or {}).get("alternative_dtype")
    ref = ((entry.get("baseline") or entry.get("comparison") or {}).get("alternative_dtype") if entry.get("baseline")
           else (entry.get("comparison") or {}).get("reference_dtype"))
    return not test or not ref or test == ref
