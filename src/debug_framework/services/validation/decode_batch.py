"""All the comparisons of one decode step in one vectorised pass (docs/validation.md, "Decode steps").

A decode step's checkpoints are small (``[batch, 1, hidden]``, the logits ``[batch, 1, vocab]``,
each layer's new K/V entries) and many: :func:`~debug_framework.comparison.compare` costs most of
its time in setting up each one. :func:`compare_many` stacks the pairs of equal size and
computes, per pair, what ``compare``'s streaming pass computes (in float64, the reference's
values against the other side's): the error sums (mean absolute error, RMSE, relative L2,
cosine, SQNR, mean and max relative error), the median and 99th percentile of the absolute
error (exact), the mismatches and gross mismatches against the tolerance and its verdict, and
the worst element. It leaves out what a judgement of a passing step does not read: the ULP
count (None) and all but the worst element. A pair it cannot take as it is (a shape mismatch,
a non-finite value, integers, a tensor off the CPU) is compared by ``compare`` itself, as is a
pair that fails its tolerance; the stage recompares with ``compare`` any checkpoint its judge
fails, so a failure's evidence is always complete.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ...capture.keys import CapturedTensor
from ...comparison import ComparisonResult, Tolerance, WorstElement, compare, default_tolerance, row_errors

if TYPE_CHECKING:
    import torch

__all__ = ["Pair", "compare_many", "measure_many"]


@dataclass(frozen=True)
class Pair:
    """One comparison of a step: ``other`` against ``reference``, under ``tolerance`` (None: the
    default for the less precise dtype), named ``name``."""

    reference: CapturedTensor
    other: CapturedTensor
    tolerance: Tolerance | None
    name: str


def _tensor(x: CapturedTensor) -> torch.Tensor | None:
    """``x`` as a CPU float tensor, None where the batched pass does not take it."""
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(x) if isinstance(x, np.ndarray) else None
    if t is None or not t.is_floating_point() or t.device.type != "cpu":
        return None
    return t


#: the default tolerance by governing dtype, one object each (every pair of a step shares it)
_DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {}


def _default_tolerance(dtype: torch.dtype) -> Tolerance:
    """:func:`~debug_framework.comparison.default_tolerance` of ``dtype`` (a frozen value), made once."""
    tol = _DEFAULT_TOLERANCES.get(dtype)
    if tol is None:
        tol = _DEFAULT_TOLERANCES[dtype] = default_tolerance(dtype)
    return tol


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def compare_many(pairs: Sequence[Pair]) -> list[ComparisonResult]:
    """Every pair compared, in order (see the module): one vectorised pass per group of equal
    size and dtypes (each pair flattened), ``compare`` for the rest."""
    return measure_many(pairs)[0]


def measure_many(pairs: Sequence[Pair],
                 parts: Sequence[int] | None = None) -> tuple[list[ComparisonResult], list[float]]:
    """:func:`compare_many` of ``pairs`` and each reference's RMS over its finite values
    (``sqrt(mean(x**2))``; :func:`~.evidence.reference_scale` where its part's references of its
    stack hold a non-finite value) at once: each group of references is stacked (and made float64)
    once for both. ``parts[i]`` is the part pair ``i`` belongs to (the decode step whose pass it
    compares; None: one part): what a pair measures depends only on its own part's pairs, so the
    steps of several passes measured together measure what each measured alone does."""
    refs = [_tensor(p.reference) for p in pairs]
    stacks = _stacks(refs)
    scales = _rms_of(stacks, [p.reference for p in pairs], parts)
    out: list[ComparisonResult | None] = [None] * len(pairs)
    groups: dict[tuple[object, ...], list[int]] = {}
    tensors: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for i, (p, r) in enumerate(zip(pairs, refs)):
        a = _tensor(p.other)
        ok = r is not None and a is not None and tuple(r.shape) == tuple(a.shape) and r.numel() > 0
        tensors.append((r, a) if ok else None)  # type: ignore[arg-type]
        if ok:
            assert r is not None and a is not None
            groups.setdefault((r.numel(), r.dtype, a.dtype), []).append(i)  # flattened: equal sizes stack
    for members in groups.values():
        y = _rows(stacks, refs, members)
        for i, result in zip(members, _batch([tensors[i] for i in members], [pairs[i] for i in members], *y)):  # type: ignore[misc]
            out[i] = result
    return [res if res is not None else compare(p.reference, p.other, tolerance=p.tolerance, check_dtype=False,
                                                 name=p.name) for res, p in zip(out, pairs)], scales


class _Stack(NamedTuple):
    """References of one size and dtype stacked once: their indices among the pairs, the stack
    ``[len, numel]`` (float64), each row's sum of squares and whether each row is all finite."""

    members: list[int]
    values: np.ndarray
    squares: np.ndarray
    finite: np.ndarray


#: the references' stacks by (size, dtype)
_Stacks = dict[tuple[object, ...], _Stack]


def _stacks(refs: Sequence[torch.Tensor | None]) -> _Stacks:
    """The CPU float tensors among ``refs`` stacked by (size, dtype) (:func:`_stacked`)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, x in enumerate(refs):
        if x is not None and x.numel():
            groups.setdefault((x.numel(), x.dtype), []).append(i)
    out: _Stacks = {}
    for key, members in groups.items():
        values = _stacked([refs[i] for i in members])  # type: ignore[misc]
        out[key] = _Stack(members, values, np.square(values).sum(1), np.isfinite(values).all(axis=1))
    return out


def _rows(stacks: _Stacks, refs: Sequence[torch.Tensor | None],
          members: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stacked rows of references ``members`` (all of one stack), their sums of squares and
    finiteness: the stack's own where they are all of it, in order, else those rows."""
    r = refs[members[0]]
    assert r is not None
    stack = stacks[(r.numel(), r.dtype)]
    if stack.members == members:
        return stack.values, stack.squares, stack.finite
    at = {i: j for j, i in enumerate(stack.members)}
    rows = [at[i] for i in members]
    return stack.values[rows], stack.squares[rows], stack.finite[rows]


def _rms_of(stacks: _Stacks, tensors: Sequence[CapturedTensor | None], parts: Sequence[int] | None) -> list[float]:
    """Each tensor's RMS (``sqrt(mean(x**2))``) from its stack (where its part's rows of the stack
    hold a non-finite value, and a tensor in none: :func:`~.evidence.reference_scale`)."""
    from .evidence import reference_scale

    out: list[float | None] = [None] * len(tensors)
    for stack in stacks.values():
        every = bool(stack.finite.all())
        if not every and parts is None:
            continue
        rms: list[float | None] = np.sqrt(stack.squares / stack.values.shape[1]).tolist()
        if not every and parts is not None:  # only the parts whose rows here are all finite
            bad = {parts[i] for i, ok in zip(stack.members, stack.finite.tolist()) if not ok}
            rms = [None if parts[i] in bad else v for i, v in zip(stack.members, rms)]
        for i, v in zip(stack.members, rms):
            out[i] = v
    return [v if v is not None else reference_scale(t) for v, t in zip(out, tensors)]


def _batch(items: list[tuple[torch.Tensor, torch.Tensor]], pairs: list[Pair], y: np.ndarray, y2: np.ndarray,
           y_finite: np.ndarray) -> list[ComparisonResult | None]:
    """One stacked pass over pairs of one size and dtypes (``y`` their references stacked, ``y2``
    each row's sum of squares, ``y_finite`` whether it is all finite); None for a pair left to
    ``compare`` (a non-finite value, or a failed tolerance whose reason ``compare`` writes)."""
    import torch

    ref0, alt0 = items[0]
    governing = ref0.dtype if torch.finfo(ref0.dtype).eps >= torch.finfo(alt0.dtype).eps else alt0.dtype
    default = _default_tolerance(governing)  # one object for every pair that takes it
    tols = [p.tolerance or default for p in pairs]
    # stacked once by torch (any float dtype), then every row's sums in one fused pass (NumPy's own sums)
    x = _stacked([a for _, a in items])
    n = y.shape[1]
    ad, sums, worst_at, x_finite = row_errors(x, y, np.array([t.rtol for t in tols], np.float64),
                                              np.array([t.atol for t in tols], np.float64),
                                              np.array([t.outlier_factor for t in tols], np.float64),
                                              torch.finfo(governing).eps)
    finite = (x_finite & y_finite).tolist()
    quant = _quantiles(ad, (0.5, 0.99))
    every = np.arange(len(items))
    rows, squares, qs = sums.tolist(), y2.tolist(), quant.tolist()
    shapes = [tuple(r.shape) for r, _ in items]
    worst = _unravel(worst_at, shapes)
    # each pair's worst element, both values and its error, gathered at once
    w_ad, w_y, w_x = ad[every, worst_at].tolist(), y[every, worst_at].tolist(), x[every, worst_at].tolist()
    # a group's pairs share their dtypes (:func:`measure_many` groups by them)
    ref_dtype, alt_dtype, dtype_match = _dtype_name(ref0), _dtype_name(alt0), ref0.dtype == alt0.dtype
    out: list[ComparisonResult | None] = []
    for k, (p, tol) in enumerate(zip(pairs, tols)):
        if not finite[k]:
            out.append(None)
            continue
        s_ad, s_d2, s_a2, s_ar, s_rel, max_rel, mism, gmism = rows[k]  # ROW_SUMS
        s_r2 = squares[k]
        pct = 100.0 * mism / n
        if not tol.passes(mism, pct, gmism):
            out.append(None)  # compare() writes the failure's reason and worst elements
            continue
        shape = shapes[k]
        out.append(ComparisonResult(
            passed=True, reason=None, tolerance=tol, name=p.name, reference_shape=shape, alternative_shape=shape,
            reference_dtype=ref_dtype, alternative_dtype=alt_dtype, dtype_match=dtype_match, numel=n, finite_count=n,
            max_abs_error=w_ad[k], mean_abs_error=s_ad / n, median_abs_error=qs[k][0], p99_abs_error=qs[k][1],
            max_rel_error=max_rel, mean_rel_error=s_rel / n, rmse=math.sqrt(s_d2 / n), rel_l2_error=_rel_l2(s_d2, s_r2),
            cosine_similarity=_cosine(s_a2, s_r2, s_ar), sqnr_db=_sqnr(s_d2, s_r2), mismatch_count=int(mism),
            mismatch_percent=pct, gross_mismatch_count=int(gmism),
            worst=[WorstElement(worst[k], w_y[k], w_x[k], w_ad[k])]))
    return out


def _unravel(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each flat index ``flat[i]`` as an index of ``shapes[i]`` (one ``np.unravel_index`` per shape)."""
    out: list[tuple[int, ...]] = [()] * len(shapes)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, shape in enumerate(shapes):
        by_shape.setdefault(shape, []).append(i)
    for shape, members in by_shape.items():
        if not shape:  # a 0-d tensor: its one element has the index ()
            continue
        coords = np.unravel_index(flat[members], shape)
        for i, index in zip(members, zip(*(c.tolist() for c in coords))):
            out[i] = tuple(index)
    return out


def _stacked(tensors: list[torch.Tensor]) -> np.ndarray:
    """Tensors of one size and dtype flattened and stacked ``[len, numel]``, float64 NumPy: each
    run of equal shapes stacked as it is (one copy, views of a cache included), then flattened."""
    import torch

    runs: list[list[torch.Tensor]] = []
    for t in tensors:
        if runs and runs[-1][0].shape == t.shape:
            runs[-1].append(t)
        else:
            runs.append([t])
    parts = [torch.stack(run).reshape(len(run), -1) for run in runs]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).to(torch.float64).numpy()


def _quantiles(values: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """Each row's quantiles ``qs`` ``[rows, len(qs)]``, as ``torch.quantile`` computes them (linear
    interpolation between the two order statistics around ``q x (n - 1)``), from one sort."""
    ordered = np.sort(values, axis=1)
    n = ordered.shape[1]
    cols = []
    for q in qs:
        at = q * (n - 1)
        lo = int(math.floor(at))
        hi = min(lo + 1, n - 1)
        w = at - lo
        cols.append(ordered[:, lo] if w == 0.0 else ordered[:, lo] + w * (ordered[:, hi] - ordered[:, lo]))
    return np.stack(cols, axis=1)


def _rel_l2(s_d2: float, s_r2: float) -> float:
    if s_r2 == 0.0:
        return 0.0 if s_d2 == 0.0 else math.inf
    return math.sqrt(s_d2) / math.sqrt(s_r2)


def _cosine(s_a2: float, s_r2: float, s_ar: float) -> float:
    if s_a2 == 0.0 and s_r2 == 0.0:
        return 1.0
    if s_a2 == 0.0 or s_r2 == 0.0:
        return 0.0
    return max(-1.0, min(1.0, s_ar / (math.sqrt(s_a2) * math.sqrt(s_r2))))


def _sqnr(s_d2: float, s_r2: float) -> float:
    if s_d2 == 0.0:
        return math.inf
    return -math.inf if s_r2 == 0.0 else 10.0 * math.log10(s_r2 / s_d2)
