"""``compare``: one streaming pass over a pair of tensors, every metric at once.

CPU tensors and NumPy arrays go through the fused numba kernel (``_kernel.accumulate``); tensors on
another device (CUDA, MPS, ...) are compared where they live with the same algorithm written in
torch ops (``_accumulate_torch``). A pair of NumPy arrays (and Python numbers) goes through the
numba kernel as NumPy arrays, without torch (the same kernel and finalisation: the same numbers and
verdict as for the same values as CPU tensors). Both engines fold chunks into the same small state (``_state.KernelState``),
so extra memory is bounded by the chunk size whatever the input size. What is decided once per
comparison (engine, dtypes, chunk size, the tolerance as the kernels read it) is one frozen
:class:`ComparePlan`, built before the pass and read whole by the pass, the finalisation and the verdict.

Quantiles (median, p99) are exact up to ``exact_quantile_limit`` elements (the kernel keeps every
error in one float64 buffer, 8 MiB at the default limit, and the histogram narrows the selection to
a few buckets); above it they come from a histogram of log-spaced buckets of relative width 1/16 and
are within 1/32 (3.2 %) relative of a value that lies between the two exact order statistics being
interpolated.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..errors import ComparisonError
from . import _kernel as K
from ._inputs import Array, as_array, as_tensor, int_view_dtype, is_tensor, iter_flat_chunks, ulp_mask
from .positions import applies_to, full_index, position_mask, select_positions
from ._state import HIST_BUCKETS, HIST_SHIFT, KernelParams, KernelState, new_state, read_totals
from .result import ComparisonResult, WorstElement
from .tolerance import DType, PassRule, Tolerance, default_tolerance, dtype_name, float_eps, is_float_dtype, less_precise_dtype

if TYPE_CHECKING:
    import torch

__all__ = ["compare", "in_full_tensor", "DEFAULT_CHUNK_ELEMENTS", "EXACT_QUANTILE_LIMIT"]

#: Elements per chunk when a chunk must be converted or copied (2M: at most 16 MiB per side in float64).
DEFAULT_CHUNK_ELEMENTS = 1 << 21
#: Up to this many elements, median and p99 are computed exactly.
EXACT_QUANTILE_LIMIT = 1 << 20

Engine = Literal["auto", "numba", "torch"]


def compare(
    reference: object,
    alternative: object,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool | None = None,
    pass_rule: PassRule | None = None,
    max_mismatch_percent: float | None = None,
    outlier_factor: float | None = None,
    tolerance: Tolerance | None = None,
    check_dtype: bool = True,
    top_k: int = 5,
    name: str = "",
    chunk_elements: int | None = None,
    exact_quantile_limit: int = EXACT_QUANTILE_LIMIT,
    engine: Engine = "auto",
    positions: object = None,
) -> ComparisonResult:
    """Compare ``alternative`` against ``reference`` and return every metric plus a verdict.

    Args:
        reference, alternative: torch tensors (any device), NumPy arrays or Python numbers.
        rtol, atol, equal_nan, pass_rule, max_mismatch_percent, outlier_factor: override single
            fields of the tolerance.
        tolerance: the base tolerance; default: torch.testing's defaults for the less precise of
            the two dtypes (exact for integers and bool).
        check_dtype: a dtype difference fails the result (it is always recorded in ``dtype_match``).
        top_k: how many worst elements to report.
        name: a label carried into the result (a checkpoint or output leaf name).
        chunk_elements: chunk size of the streaming pass (tests use small values).
        exact_quantile_limit: above this many elements, median/p99 come from the histogram.
        engine: ``"auto"`` (numba on CPU, torch elsewhere), or force one.
        positions: an attention mask ``[batch, sequence]`` (non-zero = a token): where both
            tensors' leading dimensions are its shape, only the model positions are compared
            (padded positions are not outputs); the worst elements keep their full index and
            ``masked_positions`` counts the positions left out (:mod:`.positions`).

    Never raises for a shape or dtype mismatch: the result fails with the reason. Raises
    ``ComparisonError`` (DF006) for inputs that are not numeric tensors.
    """
    if engine == "torch" or is_tensor(reference) or is_tensor(alternative):
        ref, alt = as_tensor(reference, "reference"), as_tensor(alternative, "alternative")
    else:  # NumPy arrays and Python numbers: the numba kernel reads them as they are, no torch
        ref, alt = as_array(reference, "reference"), as_array(alternative, "alternative")
    mask = position_mask(positions)
    if mask is not None and ref.shape == alt.shape and applies_to(tuple(ref.shape), mask):
        inner = compare(select_positions(ref, mask), select_positions(alt, mask), rtol=rtol, atol=atol,
                        equal_nan=equal_nan, pass_rule=pass_rule, max_mismatch_percent=max_mismatch_percent,
                        outlier_factor=outlier_factor, tolerance=tolerance, check_dtype=check_dtype, top_k=top_k,
                        name=name, chunk_elements=chunk_elements, exact_quantile_limit=exact_quantile_limit,
                        engine=engine)
        return in_full_tensor(inner, tuple(ref.shape), mask)
    governing = less_precise_dtype(ref.dtype, alt.dtype)
    tol = (tolerance or default_tolerance(governing)).with_overrides(
        rtol=rtol,
        atol=atol,
        equal_nan=equal_nan,
        pass_rule=pass_rule,
        max_mismatch_percent=max_mismatch_percent,
        outlier_factor=outlier_factor,
    )
    header: dict[str, object] = dict(
        name=name,
        tolerance=tol,
        reference_shape=tuple(ref.shape),
        alternative_shape=tuple(alt.shape),
        reference_dtype=dtype_name(ref.dtype),
        alternative_dtype=dtype_name(alt.dtype),
        dtype_match=ref.dtype == alt.dtype,
    )
    if ref.shape != alt.shape:
        return ComparisonResult(
            passed=False,
            reason=f"shape mismatch: reference {tuple(ref.shape)} vs alternative {tuple(alt.shape)}",
            shape_match=False,
            numel=_numel(ref),
            **header,
        )
    plan = _plan(ref, alt, governing, tol, header, engine=engine, top_k=top_k, check_dtype=check_dtype,
                 chunk_elements=chunk_elements, exact_quantile_limit=exact_quantile_limit)
    state = new_state(plan.top_k)
    # numba's OpenMP threading layer sets the calling thread's OpenMP thread count, which torch
    # shares (libgomp); put back what the caller had so a comparison never changes torch's threads
    # (none to keep when torch is not imported).
    torch = sys.modules.get("torch")
    if torch is None:
        return _run(ref, alt, plan, state)
    torch_threads = torch.get_num_threads()
    try:
        return _run(ref, alt, plan, state)
    finally:
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


def _numel(x: Array) -> int:
    """Elements of a torch tensor or NumPy array."""
    return int(x.size) if isinstance(x, np.ndarray) else x.numel()


def in_full_tensor(result: ComparisonResult, shape: tuple[int, ...], mask: np.ndarray) -> ComparisonResult:
    """A comparison of the model positions reported against the full tensor: its shapes, the
    worst elements' and first non-finite value's indices in it, and the positions left out."""
    inner_shape = tuple(result.reference_shape)
    first = result.first_nonfinite_index
    if first is not None:
        first = int(np.ravel_multi_index(full_index(tuple(int(v) for v in np.unravel_index(first, inner_shape)),
                                                    mask, shape), shape))
    worst = [dataclasses.replace(w, index=full_index(w.index, mask, shape)) for w in result.worst]
    return dataclasses.replace(result, reference_shape=shape, alternative_shape=shape, worst=worst,
                               first_nonfinite_index=first, masked_positions=int(mask.size - mask.sum()))


@dataclass(frozen=True)
class ComparePlan:
    """Everything ``compare`` decides once per comparison, before the pass; the pass, the
    finalisation and the verdict read it whole."""

    tolerance: Tolerance
    engine: Literal["numba", "torch"]
    device: torch.device | None  #: where the pass runs; None: NumPy arrays (the CPU)
    compute_dtype: torch.dtype | np.dtype  #: what both sides are read as: float64 when either side is, or is not a float
    ulp_dtype: torch.dtype | np.dtype | None  #: the less precise float dtype, whose ULPs are counted; None: no ULP
    numel: int
    exact_quantiles: bool  #: numel <= exact_quantile_limit: median and p99 exact, else from the histogram
    exact_int_mismatch: bool  #: integers or bool at zero tolerance: mismatches counted by equality
    chunk_elements: int  #: elements per streamed chunk (the whole input when read in place)
    top_k: int
    check_dtype: bool
    kernel: KernelParams  #: the tolerance, ULP mask and relative-error floor as both engines' kernels read them
    header: Mapping[str, object]  #: the result's fields known before the pass (name, tolerance, shapes, dtypes)


def _plan(ref: Array, alt: Array, governing: DType, tol: Tolerance, header: Mapping[str, object], *,
          engine: Engine, top_k: int, check_dtype: bool, chunk_elements: int | None,
          exact_quantile_limit: int) -> ComparePlan:
    """The plan of comparing ``alt`` with ``ref`` (same shape; ``governing`` is the less precise of
    their dtypes) under ``tol``; raises ComparisonError (DF006) for an unknown engine or numba asked
    for tensors off the CPU. ``ref`` and ``alt`` are both torch tensors or both NumPy arrays."""
    arrays = isinstance(ref, np.ndarray)
    device = None if arrays else ref.device if ref.device.type != "cpu" else alt.device
    device_type = "cpu" if device is None else device.type
    if engine == "auto":
        engine = "numba" if device_type == "cpu" else "torch"
    elif engine not in ("numba", "torch"):
        raise ComparisonError(f"unknown engine {engine!r}", hint="use 'auto', 'numba' or 'torch'")
    elif engine == "numba" and device_type != "cpu":
        raise ComparisonError(
            f"engine='numba' runs on the CPU, but the tensors are on {device}",
            hint="use engine='auto' or 'torch' to compare them where they live",
        )
    both_float = is_float_dtype(ref.dtype) and is_float_dtype(alt.dtype)
    wide = "float64" in (dtype_name(ref.dtype), dtype_name(alt.dtype)) or not both_float
    if engine == "torch" and device_type == "mps":
        wide = False  # MPS has no float64
    if arrays:
        compute: DType = np.dtype(np.float64 if wide else np.float32)
        contiguous = ref.flags.c_contiguous and alt.flags.c_contiguous
    else:
        torch = sys.modules["torch"]
        compute = torch.float64 if wide else torch.float32
        contiguous = ref.is_contiguous() and alt.is_contiguous()
    ulp_dtype = governing if both_float else None
    n = _numel(ref)
    no_copy = engine == "numba" and ref.dtype == alt.dtype == compute and contiguous
    chunk = n if (no_copy and chunk_elements is None) else (chunk_elements or DEFAULT_CHUNK_ELEMENTS)
    kernel = KernelParams(
        ulp_mask=ulp_mask(ulp_dtype) if ulp_dtype is not None else 0,
        rtol=float(tol.rtol),
        atol=float(tol.atol),
        gross_factor=float(tol.outlier_factor),
        rel_eps=float_eps(governing) if is_float_dtype(governing) else 1.0,
        equal_nan=bool(tol.equal_nan),
    )
    return ComparePlan(
        tolerance=tol,
        engine=engine,
        device=device,
        compute_dtype=compute,
        ulp_dtype=ulp_dtype,
        numel=n,
        exact_quantiles=n <= exact_quantile_limit,
        exact_int_mismatch=not both_float and tol.rtol == 0.0 and tol.atol == 0.0,
        chunk_elements=max(1, chunk),
        top_k=max(0, int(top_k)),
        check_dtype=check_dtype,
        kernel=kernel,
        header=header,
    )


def _run(ref: Array, alt: Array, plan: ComparePlan, state: KernelState) -> ComparisonResult:
    """Stream both tensors chunk by chunk through ``plan.engine`` into ``state``, then finalise."""
    # exact quantiles: the numba kernel writes every pair's error into one buffer (<= 8 MiB at the
    # default limit); the torch engine collects the finite errors chunk by chunk
    exact_q = plan.exact_quantiles
    errs: list[np.ndarray] | np.ndarray = np.empty(plan.numel if exact_q else 0, np.float64) if plan.engine == "numba" else []
    exact_mismatch = 0
    offset = 0
    chunk = plan.chunk_elements
    for rc, ac in zip(iter_flat_chunks(ref, chunk), iter_flat_chunks(alt, chunk), strict=True):
        if plan.engine == "torch":  # the numba engine's chunks are on the CPU already
            rc = rc.to(plan.device)
            ac = ac.to(plan.device)
        af, ai = _prepare(ac, plan.compute_dtype, plan.ulp_dtype)
        rf, ri = _prepare(rc, plan.compute_dtype, plan.ulp_dtype)
        if plan.engine == "numba":
            a_np, r_np, ai_np, ri_np = (v.numpy() if is_tensor(v) else v for v in (af, rf, ai, ri))
            K.fold(a_np, r_np, ai_np, ri_np, np.int64(offset), plan.kernel, state,
                   errs[offset:offset + a_np.shape[0]] if exact_q else None)
        else:
            _accumulate_torch(state, af, rf, ai, ri, offset, plan.kernel, errs if exact_q else None)
        if plan.exact_int_mismatch:
            exact_mismatch += int((rc != ac).sum().item())
        offset += _numel(rc)

    return _finalize(ref, alt, plan, state, errs if exact_q else None,
                     exact_mismatch if plan.exact_int_mismatch else None)


def _prepare(chunk: Array, compute: DType, ulp_dtype: DType | None) -> tuple[Array, Array | None]:
    """``chunk`` (a torch tensor or NumPy array) as ``compute`` values, and as integer views of its
    ``ulp_dtype`` bit patterns (or None)."""
    if isinstance(chunk, np.ndarray):
        f = chunk if chunk.dtype == compute else chunk.astype(compute)
        if ulp_dtype is None:
            return f, None
        u = chunk if chunk.dtype == ulp_dtype else chunk.astype(ulp_dtype)
        return f, u.view(int_view_dtype(ulp_dtype))
    f = chunk if chunk.dtype == compute else chunk.to(compute)
    if ulp_dtype is None:
        return f, None
    u = chunk if chunk.dtype == ulp_dtype else chunk.to(ulp_dtype)
    return f, u.view(int_view_dtype(ulp_dtype))


def _accumulate_torch(state: KernelState, a: torch.Tensor, r: torch.Tensor, ai: torch.Tensor | None,
                      ri: torch.Tensor | None, offset: int, params: KernelParams,
                      errs: list[np.ndarray] | None) -> None:
    """The kernel's algorithm in torch ops, for tensors on any device (one host sync per chunk)."""
    import torch

    tot = state.totals[0]  # a view: item assignments update the state
    # like the CPU kernel, subtract in float64 (exact for float32 inputs); MPS has no float64
    acc = torch.float32 if a.device.type == "mps" else torch.float64
    a, r = a.to(acc), r.to(acc)
    fin = torch.isfinite(a) & torch.isfinite(r)
    x = torch.where(fin, a, 0)
    y = torch.where(fin, r, 0)
    d = x - y
    ad = d.abs()
    ay = y.abs()
    bound = params.atol + params.rtol * ay
    rel = ad / ay.clamp_min(params.rel_eps)
    sums = ("sum_abs_error", "sum_sq_error", "sum_sq_ref", "sum_sq_alt", "sum_alt_ref", "sum_rel_error")
    scalars = dict(zip((*sums, "max_rel_error", "finite_count", "mismatch_count", "gross_mismatch_count"), torch.stack([
        ad.sum(dtype=acc), (d * d).sum(dtype=acc), (y * y).sum(dtype=acc), (x * x).sum(dtype=acc),
        (x * y).sum(dtype=acc), rel.sum(dtype=acc), rel.max() if rel.numel() else torch.zeros((), dtype=acc, device=a.device),
        fin.sum().to(acc), (ad > bound).sum().to(acc), (ad > params.gross_factor * bound).sum().to(acc),
    ]).tolist(), strict=True))
    for f in sums:
        tot[f] += scalars[f]
    tot["max_rel_error"] = max(tot["max_rel_error"], scalars["max_rel_error"])
    for f in ("finite_count", "mismatch_count", "gross_mismatch_count"):
        tot[f] += int(scalars[f])
    if ai is not None and ri is not None and ai.numel():
        ia, ir = ai.to(torch.int64), ri.to(torch.int64)
        ma, mr = ia & params.ulp_mask, ir & params.ulp_mask
        same = (ia < 0) == (ir < 0)
        u = torch.where(same, (ma - mr).abs().to(torch.float64), ma.to(torch.float64) + mr.to(torch.float64))
        u = torch.where(fin, u, 0)
        tot["max_ulp_error"] = max(int(tot["max_ulp_error"]), int(u.max().item()))
    keys = (ad.to(torch.float64).view(torch.int64) >> HIST_SHIFT)[fin]
    np.add(state.hist, torch.bincount(keys, minlength=HIST_BUCKETS).cpu().numpy(), out=state.hist)
    tv, ti = state.worst_errors, state.worst_indices
    k = tv.shape[0]
    vals = torch.where(fin, ad, -1.0)
    kk = min(k, vals.numel())
    if kk:
        top_v, top_i = torch.topk(vals.to(torch.float64), kk)
        cand_v = np.concatenate([tv, top_v.cpu().numpy()])
        cand_i = np.concatenate([ti, top_i.cpu().numpy() + offset])
        order = np.argsort(-cand_v, kind="stable")[:k]
        tv[:] = cand_v[order]
        ti[:] = cand_i[order]
    if errs is not None:
        errs.append(ad[fin].to(torch.float64).cpu().numpy())
    nf = ~fin
    if bool(nf.any()):
        an, rn = torch.isnan(a), torch.isnan(r)
        ainf, rinf = torch.isinf(a), torch.isinf(r)
        counts = torch.stack([
            an.sum(), rn.sum(), (ainf & (a > 0)).sum(), (ainf & (a < 0)).sum(),
            (rinf & (r > 0)).sum(), (rinf & (r < 0)).sum(),
        ]).tolist()
        for f, v in zip(("nan_count_alt", "nan_count_ref", "posinf_count_alt", "neginf_count_alt",
                         "posinf_count_ref", "neginf_count_ref"), counts, strict=True):
            tot[f] += int(v)
        first = int(torch.nonzero(nf)[0].item()) + offset
        if tot["first_nonfinite_index"] < 0:
            tot["first_nonfinite_index"] = first
        match = (an & rn) if params.equal_nan else torch.zeros_like(an)
        match = match | (~an & ~rn & (a == r))
        bad = nf & ~match
        nbad = int(bad.sum().item())
        tot["mismatch_count"] += nbad
        tot["gross_mismatch_count"] += nbad
        nfi = state.nonfinite_mismatch_indices
        if nbad:
            idx = torch.nonzero(bad).flatten()[: nfi.shape[0]].cpu().numpy() + offset
            have = nfi[nfi >= 0]
            merged = np.sort(np.concatenate([have, idx]))[: nfi.shape[0]]
            nfi[:] = -1
            nfi[: merged.shape[0]] = merged
        tot["nonfinite_mismatch_count"] += nbad


def _bucket_mid(b: int) -> float:
    if b == 0:
        return 0.0
    lo = np.array([b << HIST_SHIFT], np.int64).view(np.float64)[0]
    hi = np.array([(b + 1) << HIST_SHIFT], np.int64).view(np.float64)[0]
    return float((lo + hi) / 2)


def _hist_quantiles(hist: np.ndarray, qs: tuple[float, ...], max_ad: float) -> list[float]:
    total = int(hist.sum())
    cum = np.cumsum(hist)
    out = []
    for q in qs:
        pos = q * (total - 1)
        lo_rank, hi_rank = math.floor(pos), math.ceil(pos)
        v_lo = _bucket_mid(int(np.searchsorted(cum, lo_rank, side="right")))
        v_hi = _bucket_mid(int(np.searchsorted(cum, hi_rank, side="right")))
        v = v_lo + (v_hi - v_lo) * (pos - lo_rank)
        out.append(min(v, max_ad))
    return out


def _linear_quantiles(m: int, qs: tuple[float, ...],
                      order_statistics: Callable[[list[int]], list[float]]) -> list[float]:
    """Quantiles of ``m`` values by NumPy's default (``linear``) method, from the order statistics
    they need (``order_statistics(ranks) -> values``, ranks 0-based)."""
    plan = []
    for q in qs:
        q = np.float64(q)
        virtual = np.float64(m) * q + (1.0 + q * -1.0) - 1.0  # as NumPy computes it (alpha = beta = 1)
        prev = int(min(max(np.floor(virtual), 0), m - 1))
        plan.append((prev, min(prev + 1, m - 1), float(virtual - np.floor(virtual))))
    ranks = sorted({r for p, n_, _ in plan for r in (p, n_)})
    value = dict(zip(ranks, order_statistics(ranks), strict=True))
    out = []
    for prev, nxt, gamma in plan:
        a, b = value[prev], value[nxt]
        diff = b - a
        out.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)  # NumPy's _lerp
    return out


def _finalize(ref: Array, alt: Array, plan: ComparePlan, state: KernelState,
              errs: list[np.ndarray] | np.ndarray | None, exact_mismatch: int | None) -> ComparisonResult:
    """The metrics, the worst elements and the verdict from the folded ``state``. ``errs``: every
    pair's error (exact quantiles) or None; ``exact_mismatch``: the mismatches counted by equality
    (``plan.exact_int_mismatch``), else None."""
    tot = read_totals(state)
    hist, tv, ti, nfi = state.hist, state.worst_errors, state.worst_indices, state.nonfinite_mismatch_indices
    n = plan.numel
    nfin = tot.finite_count
    mismatch = tot.mismatch_count if exact_mismatch is None else exact_mismatch
    gross = tot.gross_mismatch_count if exact_mismatch is None else exact_mismatch
    mismatch_pct = 100.0 * mismatch / n if n else 0.0
    valid = ti >= 0
    valid_v = tv[valid]
    order = np.argsort(-valid_v, kind="stable")
    fin_v, fin_i = valid_v[order], ti[valid][order]

    metrics: dict[str, object] = {}
    if nfin:
        s_ad, s_d2, s_r2, s_a2, s_ar = tot.sum_abs_error, tot.sum_sq_error, tot.sum_sq_ref, tot.sum_sq_alt, tot.sum_alt_ref
        max_ad = float(fin_v[0]) if fin_v.size else 0.0
        if isinstance(errs, np.ndarray):  # the numba kernel's buffer: select, never sort it all
            med, p99 = _linear_quantiles(nfin, (0.5, 0.99), lambda ranks: K.exact_order_statistics(errs, hist, ranks))
        elif errs is not None:
            e = np.concatenate(errs) if errs else np.zeros(0)
            med, p99 = (float(v) for v in np.quantile(e, [0.5, 0.99])) if e.size else (0.0, 0.0)
        else:
            med, p99 = _hist_quantiles(hist, (0.5, 0.99), max_ad)
        if s_r2 == 0.0:
            rel_l2 = 0.0 if s_d2 == 0.0 else math.inf
        else:
            rel_l2 = math.sqrt(s_d2) / math.sqrt(s_r2)
        if s_a2 == 0.0 and s_r2 == 0.0:
            cos = 1.0
        elif s_a2 == 0.0 or s_r2 == 0.0:
            cos = 0.0
        else:
            prod = s_a2 * s_r2
            norm = math.sqrt(prod) if math.isfinite(prod) and prod > 0 else math.sqrt(s_a2) * math.sqrt(s_r2)
            cos = max(-1.0, min(1.0, s_ar / norm))
        if s_d2 == 0.0:
            sqnr = math.inf
        elif s_r2 == 0.0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(s_r2 / s_d2)
        metrics = dict(
            max_abs_error=max_ad,
            mean_abs_error=s_ad / nfin,
            median_abs_error=med,
            p99_abs_error=p99,
            quantiles_exact=errs is not None,
            max_rel_error=tot.max_rel_error,
            mean_rel_error=tot.sum_rel_error / nfin,
            rmse=math.sqrt(s_d2 / nfin),
            rel_l2_error=rel_l2,
            cosine_similarity=cos,
            sqnr_db=sqnr,
        )
        if plan.ulp_dtype is not None:
            metrics["max_ulp_error"] = tot.max_ulp_error
    if plan.ulp_dtype is not None:
        metrics["ulp_dtype"] = dtype_name(plan.ulp_dtype)

    worst: list[WorstElement] = []
    shape = tuple(ref.shape)

    def element(flat: int, err: float) -> WorstElement:
        idx = tuple(int(v) for v in np.unravel_index(flat, shape)) if shape else ()
        return WorstElement(idx, ref[idx].item(), alt[idx].item(), err)

    for flat in nfi[nfi >= 0][:plan.top_k]:
        worst.append(element(int(flat), math.inf))
    for v, flat in zip(fin_v, fin_i, strict=True):
        if len(worst) >= plan.top_k:
            break
        if v > 0 or not worst:
            worst.append(element(int(flat), float(v)))

    nonfinite_mismatch = tot.nonfinite_mismatch_count
    first_nf = tot.first_nonfinite_index
    passed, reason = _verdict(plan, mismatch=mismatch, gross=gross, pct=mismatch_pct,
                              nonfinite_mismatch=nonfinite_mismatch, first_nf=first_nf, worst=worst)
    return ComparisonResult(
        passed=passed,
        reason=reason,
        numel=n,
        finite_count=nfin,
        mismatch_count=mismatch,
        mismatch_percent=mismatch_pct,
        gross_mismatch_count=gross,
        nan_count_ref=tot.nan_count_ref,
        nan_count_alt=tot.nan_count_alt,
        posinf_count_ref=tot.posinf_count_ref,
        neginf_count_ref=tot.neginf_count_ref,
        posinf_count_alt=tot.posinf_count_alt,
        neginf_count_alt=tot.neginf_count_alt,
        first_nonfinite_index=first_nf if first_nf >= 0 else None,
        nonfinite_mismatch_count=nonfinite_mismatch,
        worst=worst,
        **metrics,
        **plan.header,
    )


def _verdict(plan: ComparePlan, *, mismatch: int, gross: int, pct: float, nonfinite_mismatch: int, first_nf: int,
             worst: list[WorstElement]) -> tuple[bool, str | None]:
    """(passed, the reason it failed or None) under ``plan.tolerance``'s pass rule."""
    tol, n, header = plan.tolerance, plan.numel, plan.header
    problems = []
    if plan.check_dtype and not header["dtype_match"]:
        problems.append(f"dtype mismatch: reference {header['reference_dtype']} vs alternative {header['alternative_dtype']}")
    bound = f"atol={tol.atol:g} + rtol={tol.rtol:g}*|ref|"
    ok = tol.passes(mismatch, pct, gross)
    if not ok:
        text = f"{mismatch} of {n} elements ({pct:.4g}%) outside {bound}"
        if tol.pass_rule != "allclose":
            text += f" (allowed {tol.max_mismatch_percent:g}%)"
        if tol.pass_rule == "both" and gross:
            text += f"; {gross} beyond {tol.outlier_factor:g}x the bound"
        if nonfinite_mismatch:
            text += f"; {nonfinite_mismatch} non-finite mismatches, first at flat index {first_nf}"
        if worst:
            w = worst[0]
            text += f"; worst at {w.index}: ref={w.reference!r} alt={w.alternative!r}"
        problems.append(text)
    return (not problems), ("; ".join(problems) or None)
