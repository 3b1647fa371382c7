"""Every metric of the comparison core against a plain float64 NumPy computation."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from debug_framework.comparison import compare

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def ordered(bits: np.ndarray, width: int) -> list[int]:
    mask = (1 << (width - 1)) - 1
    return [-(int(b) & mask) if int(b) < 0 else int(b) & mask for b in bits]


def reference_metrics(ref: torch.Tensor, alt: torch.Tensor, rtol: float, atol: float, equal_nan: bool):
    """Straightforward, one-shot float64 NumPy computation of the metrics."""
    r = ref.double().numpy().reshape(-1)
    a = alt.double().numpy().reshape(-1)
    fin = np.isfinite(r) & np.isfinite(a)
    d = a[fin] - r[fin]
    ad = np.abs(d)
    ay = np.abs(r[fin])
    rel_eps = float(torch.finfo(ref.dtype).eps)
    both_nan = np.isnan(r) & np.isnan(a)
    same_inf = ~np.isnan(r) & ~np.isnan(a) & ~fin & (r == a)
    nonfinite_bad = ~fin & ~same_inf & ~(both_nan if equal_nan else np.zeros_like(fin))
    out = {
        "mismatch_count": int((ad > atol + rtol * ay).sum() + nonfinite_bad.sum()),
        "finite_count": int(fin.sum()),
        "nan_count_ref": int(np.isnan(r).sum()),
        "nan_count_alt": int(np.isnan(a).sum()),
        "posinf_count_alt": int(np.isposinf(a).sum()),
        "neginf_count_ref": int(np.isneginf(r).sum()),
    }
    bad_idx = np.flatnonzero(~np.isfinite(r) | ~np.isfinite(a))
    out["first_nonfinite_index"] = int(bad_idx[0]) if bad_idx.size else None
    if fin.any():
        width = ref.element_size() * 8
        ib = ordered(alt.contiguous().view(INT_VIEW[ref.dtype]).numpy().reshape(-1)[fin], width) if alt.dtype != torch.bfloat16 else ordered(alt.contiguous().view(torch.int16).numpy().reshape(-1)[fin], 16)
        rb = ordered(ref.contiguous().view(INT_VIEW[ref.dtype]).numpy().reshape(-1)[fin], width)
        out.update(
            max_abs_error=float(ad.max()),
            mean_abs_error=float(ad.mean()),
            median_abs_error=float(np.quantile(ad, 0.5)),
            p99_abs_error=float(np.quantile(ad, 0.99)),
            max_rel_error=float((ad / np.maximum(ay, rel_eps)).max()),
            mean_rel_error=float((ad / np.maximum(ay, rel_eps)).mean()),
            rmse=float(np.sqrt((d * d).mean())),
            max_ulp_error=max(abs(x - y) for x, y in zip(ib, rb, strict=True)),
        )
        s_r2, s_a2, s_d2 = float((r[fin] ** 2).sum()), float((a[fin] ** 2).sum()), float((d * d).sum())
        out["rel_l2_error"] = (0.0 if s_d2 == 0 else math.inf) if s_r2 == 0 else math.sqrt(s_d2 / s_r2)
        if s_r2 == 0 and s_a2 == 0:
            out["cosine_similarity"] = 1.0
        elif s_r2 == 0 or s_a2 == 0:
            out["cosine_similarity"] = 0.0
        else:
            out["cosine_similarity"] = float(np.dot(a[fin], r[fin]) / math.sqrt(s_a2 * s_r2))
        out["sqnr_db"] = math.inf if s_d2 == 0 else (-math.inf if s_r2 == 0 else 10 * math.log10(s_r2 / s_d2))
    return out


def close(x, y) -> bool:
    if x is None or y is None:
        return x is y
    if isinstance(x, float) and (math.isinf(x) or math.isinf(y)):
        return x == y
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-300) or abs(x - y) <= 1e-12 * max(1.0, abs(y))


@st.composite
def pairs(draw):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9))
    special = draw(st.booleans())
    base = draw(hnp.arrays(np.float64, shape, elements=st.floats(-1e3, 1e3, allow_nan=False, width=32)))
    noise = draw(hnp.arrays(np.float64, shape, elements=st.floats(-0.0078125, 0.0078125, width=32)))
    base, noise = np.asarray(base, np.float64), np.asarray(noise, np.float64)
    ref = torch.from_numpy(base).to(dtype)
    alt = torch.from_numpy(np.asarray(base + noise * draw(st.sampled_from([0.0, 1e-6, 1e-3, 1.0])))).to(dtype)
    if special and ref.numel():
        flat_r, flat_a = ref.reshape(-1), alt.reshape(-1)
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, ref.numel() - 1))
            which = draw(st.sampled_from(["ref", "alt", "both"]))
            val = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
            if which in ("ref", "both"):
                flat_r[i] = val
            if which in ("alt", "both"):
                flat_a[i] = val
    return ref, alt


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs(), st.sampled_from([(1e-3, 1e-5), (0.0, 0.0), (1e-6, 1e-8)]), st.booleans())
def test_metrics_match_float64_numpy(pair, tols, equal_nan):
    ref, alt = pair
    rtol, atol = tols
    res = compare(ref, alt, rtol=rtol, atol=atol, equal_nan=equal_nan, top_k=3)
    expected = reference_metrics(ref, alt, rtol, atol, equal_nan)
    for key, value in expected.items():
        assert close(getattr(res, key), value), (key, getattr(res, key), value)
    assert res.numel == ref.numel()
    assert res.passed == (expected["mismatch_count"] == 0)
    assert res.tolerance.rtol == rtol and res.tolerance.atol == atol


@settings(max_examples=60, deadline=None)
@given(pairs(), st.integers(1, 17))
def test_streaming_agrees_with_one_shot(pair, chunk):
    ref, alt = pair
    one = compare(ref, alt, rtol=1e-4, atol=1e-6, top_k=4)
    streamed = compare(ref, alt, rtol=1e-4, atol=1e-6, top_k=4, chunk_elements=chunk)
    for key in ("mismatch_count", "finite_count", "max_abs_error", "max_rel_error", "max_ulp_error",
                "nan_count_ref", "nan_count_alt", "first_nonfinite_index", "median_abs_error", "p99_abs_error"):
        assert close(getattr(streamed, key), getattr(one, key)), key
    for key in ("mean_abs_error", "rmse", "cosine_similarity"):
        a, b = getattr(streamed, key), getattr(one, key)
        assert (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), key
    assert [w.index for w in streamed.worst if math.isinf(w.abs_error)] == [w.index for w in one.worst if math.isinf(w.abs_error)]
    assert [w.abs_error for w in streamed.worst] == [w.abs_error for w in one.worst]


@settings(max_examples=40, deadline=None)
@given(pairs())
def test_torch_engine_agrees_with_numba_engine(pair):
    ref, alt = pair
    a = compare(ref, alt, rtol=1e-4, atol=1e-6, engine="numba")
    b = compare(ref, alt, rtol=1e-4, atol=1e-6, engine="torch")
    for key in ("mismatch_count", "finite_count", "max_abs_error", "max_ulp_error", "nan_count_alt",
                "first_nonfinite_index", "median_abs_error", "passed"):
        assert close(getattr(a, key), getattr(b, key)), key
    assert [w.abs_error for w in a.worst] == [w.abs_error for w in b.worst]


def test_histogram_quantiles_within_documented_bound():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(300_000).astype(np.float32)
    alt = (ref + rng.standard_normal(300_000).astype(np.float32) * np.float32(1e-3)).astype(np.float32)
    exact = compare(ref, alt)
    approx = compare(ref, alt, exact_quantile_limit=0, chunk_elements=65_536)
    assert exact.quantiles_exact and not approx.quantiles_exact
    for key in ("median_abs_error", "p99_abs_error"):
        assert abs(getattr(approx, key) - getattr(exact, key)) <= getattr(exact, key) / 16
