"""The comparison core's NumPy path: a pair of NumPy arrays (or Python numbers) is compared without
torch, by the same kernel and finalisation as the same values as CPU tensors, so both paths give
the same metrics and verdict (one judge). Each case compares NumPy inputs and their torch views and
asserts the two results are equal field by field. That an ONNX file's validation never imports
torch is tests/backends/test_onnx_file.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from debug_framework.comparison import Tolerance, compare, compare_nested, default_tolerance, less_precise_dtype
from debug_framework.comparison._inputs import is_tensor


def _same(a, b) -> None:
    """Two comparison results are the same judgement: every field equal (NaN equals NaN)."""
    da, db = a.to_dict(), b.to_dict()
    assert da.keys() == db.keys()
    for key in da:  # JSON text: floats by their shortest repr (same to the last bit), NaN as NaN
        assert json.dumps(da[key], sort_keys=True, default=str) == json.dumps(db[key], sort_keys=True, default=str), key


def _both(ref: np.ndarray, alt: np.ndarray, **kw):
    """The result of the NumPy path and of the torch path (the same values as CPU tensors)."""
    on_numpy = compare(ref, alt, **kw)
    on_torch = compare(torch.from_numpy(np.ascontiguousarray(ref)) if ref.flags.c_contiguous else torch.from_numpy(ref),
                       torch.from_numpy(alt), **kw)
    _same(on_numpy, on_torch)
    return on_numpy


def _with_specials(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
    ref = rng.standard_normal(shape)
    alt = (ref + rng.standard_normal(shape) * 1e-4).astype(dtype)
    flat_r, flat_a = ref.reshape(-1), alt.reshape(-1)
    flat_r[[1, 5, 9]] = [np.nan, np.inf, -np.inf]
    flat_a[[1, 5, 9, 12, 13]] = [np.nan, np.inf, np.inf, np.nan, -np.inf]  # two agree, three do not
    flat_a[20] = 1e4  # a gross error
    return ref, alt


@pytest.mark.parametrize("alt_dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("equal_nan", [False, True])
def test_floats_with_nan_and_inf_agree(alt_dtype, equal_nan):
    rng = np.random.default_rng(0)
    ref, alt = _with_specials(rng, (3, 7, 5), alt_dtype)
    got = _both(ref, alt, equal_nan=equal_nan, check_dtype=False)
    assert got.nonfinite_mismatch_count > 0 and not got.passed
    assert got.ulp_dtype == np.dtype(alt_dtype).name
    # the histogram's quantiles (above the exact limit) and small chunks: still one judgement
    _both(ref, alt, equal_nan=equal_nan, check_dtype=False, exact_quantile_limit=8, chunk_elements=16)
    _both(ref, alt, rtol=1e-3, atol=1e-3, pass_rule="both", max_mismatch_percent=10.0, check_dtype=False)


def test_a_passing_pair_and_a_float32_pair_in_place():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((4, 64)).astype(np.float32)
    got = _both(ref, ref.copy())
    assert got.passed and got.max_abs_error == 0.0 and got.quantiles_exact
    alt = np.nextafter(ref, np.float32(np.inf))
    got = _both(ref, alt)
    assert got.max_ulp_error == 1


def test_masked_positions_agree():
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((2, 5, 3))
    alt = ref.astype(np.float32).astype(np.float64)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    alt[1, 3:] = 99.0  # padded positions: not outputs
    alt[0, 2, 1] += 0.5
    on_numpy = compare(ref, alt, positions=mask)
    on_torch = compare(torch.from_numpy(ref), torch.from_numpy(alt), positions=torch.from_numpy(mask))
    _same(on_numpy, on_torch)
    assert on_numpy.masked_positions == 2 and on_numpy.worst[0].index == (0, 2, 1)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
def test_integer_and_bool_outputs_agree(dtype):
    rng = np.random.default_rng(3)
    ref = rng.integers(0, 2 if dtype is np.bool_ else 50, (6, 4)).astype(dtype)
    alt = ref.copy()
    alt[2, 1] = not alt[2, 1] if dtype is np.bool_ else alt[2, 1] + 1
    got = _both(ref, alt)
    assert not got.passed and got.mismatch_count == 1 and got.ulp_dtype is None
    assert _both(ref, ref.copy()).passed
    _both(ref, alt.astype(np.float32), check_dtype=False)  # an integer against a float: float64 compute


def test_non_contiguous_scalars_and_shapes_agree():
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((6, 8))
    alt = ref + 1e-9
    on_numpy = compare(ref.T, alt.T, chunk_elements=5)
    on_torch = compare(torch.from_numpy(ref).T, torch.from_numpy(alt).T, chunk_elements=5)
    _same(on_numpy, on_torch)
    _same(compare(1.5, 1.5 + 1e-6), compare(torch.tensor(1.5), torch.tensor(1.5 + 1e-6)))
    _same(compare(3, 4), compare(torch.tensor(3), torch.tensor(4)))
    _same(compare(np.zeros((2, 3)), np.zeros((3, 2))), compare(torch.zeros(2, 3, dtype=torch.float64),
                                                               torch.zeros(3, 2, dtype=torch.float64)))
    got = compare_nested({"a": ref, "b": [np.ones(3, np.int64)]}, {"a": alt, "b": [np.ones(3, np.int64)]})
    assert set(got.results) == {"a", "b.0"} and all(r.passed for r in got.results.values())


def test_dtypes_of_either_kind_give_the_same_tolerance():
    for name in ("float16", "float32", "float64", "int64", "bool"):
        assert default_tolerance(np.dtype(name)) == default_tolerance(getattr(torch, name))
    assert default_tolerance(torch.bfloat16) == Tolerance(rtol=1.6e-2, atol=1e-5)
    assert less_precise_dtype(np.dtype(np.float64), np.dtype(np.float16)) == np.float16
    assert less_precise_dtype(torch.float32, torch.bfloat16) is torch.bfloat16
    assert not is_tensor(np.zeros(1)) and is_tensor(torch.zeros(1))
