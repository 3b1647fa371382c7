"""Edge cases of the comparison core."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from debug_framework.comparison import Tolerance, compare, compare_nested, default_tolerance, flatten_outputs
from debug_framework.errors import ComparisonError


def test_one_ulp_apart_float32_reports_one():
    ref = torch.tensor([1.0, -2.5, 3e-20], dtype=torch.float32)
    alt = torch.nextafter(ref, torch.tensor(math.inf))
    res = compare(ref, alt)
    assert res.max_ulp_error == 1
    assert res.ulp_dtype == "float32"


def test_ulp_across_zero_and_in_own_dtype():
    assert compare(torch.tensor([0.0]), torch.tensor([-0.0])).max_ulp_error == 0
    tiny = torch.tensor([torch.finfo(torch.float32).tiny * 2**-23])  # smallest subnormal
    assert compare(tiny, -tiny).max_ulp_error == 2
    h = torch.tensor([1.0], dtype=torch.float16)
    assert compare(h, torch.nextafter(h, torch.tensor([2.0], dtype=torch.float16))).max_ulp_error == 1
    b = torch.tensor([1.0], dtype=torch.bfloat16)
    assert compare(b, torch.tensor([1.0078125], dtype=torch.bfloat16)).max_ulp_error == 1
    # float64 reference vs float32 alternative: ULPs in float32, the less precise dtype
    r64 = torch.tensor([1.0], dtype=torch.float64)
    a32 = torch.nextafter(torch.tensor([1.0]), torch.tensor([2.0]))
    res = compare(r64, a32, check_dtype=False)
    assert res.ulp_dtype == "float32" and res.max_ulp_error == 1 and not res.dtype_match and res.passed


@pytest.mark.parametrize(
    ("dtype", "big", "int_dtype"),
    [(torch.float64, 1e308, np.int64), (torch.float32, 3.4028235e38, np.int32), (torch.float16, 65504.0, np.int16)],
)
def test_huge_opposite_signs_are_exact(dtype, big, int_dtype):
    # the sum of the two magnitudes' bit patterns: above 2**63 for float64, 2**31 for float32
    pattern = int(torch.tensor([big], dtype=dtype).numpy().view(int_dtype)[0])
    res = compare(torch.tensor([big], dtype=dtype), torch.tensor([-big], dtype=dtype))
    assert res.max_ulp_error == 2 * pattern


def test_empty_and_zero_dim():
    res = compare(torch.empty(0, 3), torch.empty(0, 3))
    assert res.passed and res.numel == 0 and res.max_abs_error is None
    res = compare(torch.tensor(1.0), torch.tensor(1.5))
    assert not res.passed and res.max_abs_error == 0.5 and res.worst[0].index == ()
    assert compare(torch.tensor(2.0), np.float32(2.0)).passed


def test_all_nan():
    nan = torch.full((4, 4), math.nan)
    res = compare(nan, nan.clone())
    assert not res.passed and res.mismatch_count == 16 and res.nan_count_ref == 16 and res.nan_count_alt == 16
    assert res.first_nonfinite_index == 0 and res.finite_count == 0 and res.max_abs_error is None
    ok = compare(nan, nan.clone(), equal_nan=True)
    assert ok.passed and ok.mismatch_count == 0


def test_infinities():
    inf = torch.tensor([math.inf, -math.inf, 1.0])
    assert compare(inf, inf.clone()).passed
    res = compare(inf, torch.tensor([math.inf, math.inf, 1.0]))
    assert not res.passed and res.mismatch_count == 1 and res.nonfinite_mismatch_count == 1
    assert res.worst[0].index == (1,) and math.isinf(res.worst[0].abs_error)
    assert res.neginf_count_ref == 1 and res.posinf_count_alt == 2 and res.inf_count_alt == 2
    nan_vs_num = compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, math.nan]))
    assert nan_vs_num.first_nonfinite_index == 1 and not nan_vs_num.passed


def test_shape_and_dtype_mismatch_are_results_not_exceptions():
    res = compare(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not res.passed and not res.shape_match and "shape mismatch" in res.reason
    res = compare(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    assert not res.passed and not res.dtype_match and "dtype mismatch" in res.reason
    assert compare(torch.zeros(3), torch.zeros(3, dtype=torch.float64), check_dtype=False).passed


def test_low_precision_defaults_and_tolerance_recorded():
    ref = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    bf = ref.bfloat16()
    assert not compare(ref, bf, check_dtype=False, tolerance=default_tolerance(torch.float32)).passed
    res = compare(ref, bf, check_dtype=False)  # governed by bfloat16: torch.testing's (1.6e-2, 1e-5)
    assert res.passed and res.tolerance.rtol == 1.6e-2 and res.tolerance.atol == 1e-5
    h = compare(ref.half(), ref.half())
    assert h.passed and h.tolerance.rtol == 1e-3


def test_non_contiguous_and_transposed():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(64, 48, generator=g)
    alt = base + 1e-3 * torch.randn(64, 48, generator=g)
    t_ref, t_alt = base.t(), alt.t()
    direct = compare(t_ref.contiguous(), t_alt.contiguous(), top_k=3)
    for chunk in (None, 5, 100, 10_000):
        res = compare(t_ref, t_alt, top_k=3, chunk_elements=chunk)
        assert res.mismatch_count == direct.mismatch_count
        assert [w.index for w in res.worst] == [w.index for w in direct.worst]
        assert res.max_abs_error == direct.max_abs_error
    strided = compare(base[::2, ::3], alt[::2, ::3])
    assert strided.numel == 32 * 16
    np_res = compare(base.numpy().T, alt.numpy().T)
    assert np_res.mismatch_count == direct.mismatch_count


def test_integers_and_bools_exact():
    big = torch.tensor([2**60, 5, 7], dtype=torch.int64)
    res = compare(big, big + torch.tensor([1, 0, 0]))
    assert not res.passed and res.mismatch_count == 1  # exact even beyond float64's 2**53
    assert compare(big, big.clone()).passed
    b = torch.tensor([True, False, True])
    res = compare(b, torch.tensor([True, True, True]))
    assert res.mismatch_count == 1 and res.worst[0].index == (1,)
    assert res.max_ulp_error is None


def test_float8_types():
    x = torch.linspace(-4, 4, 33)
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        a = x.to(dt)
        assert compare(a, a.clone()).passed
        res = compare(x, a, check_dtype=False)
        assert res.ulp_dtype == str(dt).removeprefix("torch.")
        assert res.passed  # rounding to float8 stays within float8's default tolerance


def test_worst_elements_have_nd_indices_and_values():
    ref = torch.zeros(3, 4, 5)
    alt = ref.clone()
    alt[2, 1, 3] = 0.5
    alt[0, 0, 1] = -0.25
    res = compare(ref, alt, top_k=2)
    assert [w.index for w in res.worst] == [(2, 1, 3), (0, 0, 1)]
    assert res.worst[0].alternative == 0.5 and res.worst[0].reference == 0.0
    assert res.worst[1].abs_error == 0.25


def test_pass_rules():
    ref = torch.zeros(1000)
    alt = ref.clone()
    alt[:5] = 1e-3  # 0.5 % small misses
    assert not compare(ref, alt).passed
    assert compare(ref, alt, pass_rule="mismatch", max_mismatch_percent=1.0).passed
    assert not compare(ref, alt, pass_rule="mismatch", max_mismatch_percent=0.1).passed
    assert not compare(ref, alt, pass_rule="both", max_mismatch_percent=1.0).passed  # 1e-3 > 10x atol
    assert compare(ref, alt, pass_rule="both", max_mismatch_percent=1.0, atol=2e-4).passed
    with pytest.raises(ComparisonError) as e:
        Tolerance(rtol=0, atol=0, pass_rule="nope")  # type: ignore[arg-type]
    assert "DF006" in str(e.value)


def test_cosine_sqnr_special_cases():
    z = torch.zeros(8)
    res = compare(z, z.clone())
    assert res.cosine_similarity == 1.0 and res.sqnr_db == math.inf and res.rel_l2_error == 0.0
    res = compare(z, torch.ones(8))
    assert res.cosine_similarity == 0.0 and res.rel_l2_error == math.inf
    res = compare(torch.ones(8), -torch.ones(8))
    assert res.cosine_similarity == -1.0


def test_bad_inputs_raise_df006():
    with pytest.raises(ComparisonError) as e:
        compare("abc", torch.zeros(1))
    assert "DF006" in str(e.value)
    with pytest.raises(ComparisonError):
        compare(np.array(["a"]), np.array(["a"]))
    with pytest.raises(ComparisonError):
        compare(torch.zeros(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.complex64))


def test_to_dict_json_compatible():
    import json

    res = compare(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0]))
    text = json.dumps(res.to_dict(json_compatible=True), allow_nan=False)
    assert '"Infinity"' in text


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    aux: torch.Tensor | None = None


def test_nested_outputs():
    h = (torch.ones(2), torch.zeros(2))
    ref = Out(torch.ones(3), h)
    alt = Out(torch.ones(3), (torch.ones(2), torch.full((2,), 0.5)))
    assert list(flatten_outputs(ref)) == ["logits", "hidden_states.0", "hidden_states.1"]
    res = compare_nested(ref, alt)
    assert not res.passed and res.failed_leaves == ["hidden_states.1"]
    res = compare_nested({"a": torch.ones(1), "b": [torch.ones(1)]}, {"a": torch.ones(1), "c": 1.0})
    assert res.missing == ["b.0"] and res.extra == ["c"] and not res.passed
    loose = compare_nested(ref, alt, leaf_tolerance={"hidden_states.1": Tolerance(rtol=0, atol=1.0)})
    assert loose.passed


def test_hf_model_output_flattens():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    out = BaseModelOutputWithPooling(last_hidden_state=torch.ones(1, 2, 3), pooler_output=torch.ones(1, 3))
    leaves = flatten_outputs(out)
    assert set(leaves) == {"last_hidden_state", "pooler_output"}
    assert compare_nested(out, out).passed


def test_comparison_leaves_torch_thread_count_alone():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        compare(torch.randn(1_000_000), torch.randn(1_000_000))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_engine_choice_is_checked():
    with pytest.raises(ComparisonError) as e:
        compare(torch.zeros(2), torch.zeros(2), engine="gpu")  # type: ignore[arg-type]
    assert "DF006" in str(e.value) and "unknown engine" in str(e.value)
    assert compare(torch.zeros(2), torch.zeros(2), engine="torch").passed
