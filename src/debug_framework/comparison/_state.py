"""The comparison kernel's state and constants, by name.

:class:`KernelState` is what the kernels (``_kernel``, and the torch pass in ``engine``) fold pairs
into; its scalar totals are one NumPy record (:data:`TOTALS`, the fields of :class:`Totals`) that
the numba kernels read and update by field name, and :func:`read_totals` reads back as a
:class:`Totals`. :class:`KernelParams` holds the constants of one comparison as the kernels read them.
"""

from __future__ import annotations

from typing import NamedTuple, get_type_hints

import numpy as np

__all__ = ["HIST_SHIFT", "HIST_BUCKETS", "Totals", "TOTALS", "KernelState", "KernelParams", "new_state", "read_totals"]

#: Histogram buckets: the top 16 bits of a non-negative float64 (11 exponent bits + 4 mantissa bits),
#: i.e. log-spaced buckets of relative width 1/16.
HIST_SHIFT = 48
HIST_BUCKETS = 1 << 15


class Totals(NamedTuple):
    """The scalar totals of the pairs folded so far, as Python numbers (:func:`read_totals`). Sums
    and maxima over the finite pairs; the names are those of the ``ComparisonResult`` fields they
    become. The kernels keep them as one NumPy record of these fields (:data:`TOTALS`)."""

    sum_abs_error: float  #: sum of |a - r|
    sum_sq_error: float  #: sum of (a - r)**2
    sum_sq_ref: float  #: sum of r**2
    sum_sq_alt: float  #: sum of a**2
    sum_alt_ref: float  #: sum of a*r
    sum_rel_error: float  #: sum of |a - r| / max(|r|, rel_eps)
    max_rel_error: float
    finite_count: int  #: pairs where both sides are finite (the population of the error statistics)
    mismatch_count: int  #: pairs outside atol + rtol*|ref| (non-finite mismatches included)
    gross_mismatch_count: int  #: outside outlier_factor * (atol + rtol*|ref|) (likewise)
    nan_count_alt: int
    nan_count_ref: int
    posinf_count_alt: int
    neginf_count_alt: int
    posinf_count_ref: int
    neginf_count_ref: int
    first_nonfinite_index: int  #: flat index, or -1
    nonfinite_mismatch_count: int
    max_ulp_error: int  #: uint64 in the record (float64 distances reach 2**64 - 2)


#: The record the kernels keep :class:`Totals` in (updated by field name): float64 sums and maxima,
#: int64 counts, the ULP distance in uint64.
TOTALS = np.dtype([
    (name, np.uint64 if name == "max_ulp_error" else np.float64 if kind is float else np.int64)
    for name, kind in get_type_hints(Totals).items()
])


class KernelState(NamedTuple):
    """What the kernels fold pairs into; each call adds to it. The per-thread partial states of one
    call have the same fields with a leading thread axis."""

    totals: np.ndarray  #: ``TOTALS``, shape (1,)
    hist: np.ndarray  #: int64 (HIST_BUCKETS,): finite pairs per log-spaced bucket of absolute error
    worst_errors: np.ndarray  #: float64 (k,): the k largest finite absolute errors, -1.0 where unset
    worst_indices: np.ndarray  #: int64 (k,): their flat indices, -1 where unset
    #: int64 (k,): the k smallest flat indices of non-finite mismatches, -1 where unset
    nonfinite_mismatch_indices: np.ndarray


class KernelParams(NamedTuple):
    """The constants of one comparison, as the kernels read them (built once per comparison)."""

    ulp_mask: int  #: magnitude mask of the ULP dtype's bit pattern (unused without integer views)
    rtol: float
    atol: float
    gross_factor: float  #: the tolerance's outlier_factor: a pair beyond it times the bound is gross
    rel_eps: float  #: floor of |ref| in the relative error
    equal_nan: bool


_empty = np.zeros(1, TOTALS)
_empty["first_nonfinite_index"] = -1
#: The bytes of empty totals. A new state's totals are a copy of them through a bytearray: 0.5 us,
#: where copying a structured array takes about 12 (numpy copies it field by field).
_EMPTY_TOTALS = _empty.tobytes()
del _empty


def new_state(k: int) -> KernelState:
    """An empty state keeping the ``k`` worst elements (at least one)."""
    k = max(k, 1)
    worst_errors = np.empty(k, np.float64)
    worst_errors.fill(-1.0)
    worst_indices = np.empty(k, np.int64)
    worst_indices.fill(-1)
    nonfinite_mismatch_indices = np.empty(k, np.int64)
    nonfinite_mismatch_indices.fill(-1)  # (empty + fill: a third of np.full's time)
    return KernelState(
        totals=np.frombuffer(bytearray(_EMPTY_TOTALS), TOTALS),
        hist=np.zeros(HIST_BUCKETS, np.int64),
        worst_errors=worst_errors,
        worst_indices=worst_indices,
        nonfinite_mismatch_indices=nonfinite_mismatch_indices,
    )


def read_totals(state: KernelState) -> Totals:
    """``state``'s totals as Python numbers (exactly the record's values)."""
    return Totals._make(state.totals.item(0))
