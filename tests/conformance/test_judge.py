"""The conformance sweep's judge on tensors made here (fast: no OpInfo, no compile)."""

from __future__ import annotations

import torch

from debug_framework.conformance.judge import badness, flat_outputs, judge_outputs, randomness
from debug_framework.plugins.samples import Sample


def _runs(fn, x: torch.Tensor, dtype: torch.dtype):
    """(oracle, eager in dtype, eager in dtype) of ``fn`` on ``x``."""
    return flat_outputs(fn(x.double())), flat_outputs(fn(x.to(dtype))), flat_outputs(fn(x.to(dtype)))


def test_eager_itself_passes_and_tanh_gelu_fails_in_float32():
    x = torch.randn(512, generator=torch.Generator().manual_seed(0))
    oracle, base, same = _runs(torch.nn.functional.gelu, x, torch.float32)
    ok = judge_outputs(oracle, base, same, "float32")
    assert ok["status"] == "pass" and ok["allclose_oracle"] and ok["backend_error"] <= ok["bound"]
    tanh = flat_outputs(torch.nn.functional.gelu(x, approximate="tanh"))
    bad = judge_outputs(oracle, base, tanh, "float32")
    assert bad["status"] == "fail" and "RMSE" in bad["reason"]
    assert bad["allclose_oracle"] is True  # BackendBench's 1e-2 does not see it


def test_bfloat16_rounding_is_noise_not_a_failure():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 30
    oracle, base, _ = _runs(torch.exp, x / 10, torch.bfloat16)
    # another correct bfloat16 computation: in float32, rounded once
    other = [torch.exp((x / 10).to(torch.bfloat16).float()).to(torch.bfloat16)]
    assert judge_outputs(oracle, base, other, "bfloat16")["status"] == "pass"


def test_shape_dtype_count_and_integer_outputs():
    o, b = [torch.zeros(3, dtype=torch.float64)], [torch.zeros(3)]
    assert "shape" in judge_outputs(o, b, [torch.zeros(4)], "float32")["reason"]
    assert "float16" in judge_outputs(o, b, [torch.zeros(3, dtype=torch.float16)], "float32")["reason"]
    assert judge_outputs(o, b, [torch.zeros(3), torch.zeros(3)], "float32")["status"] == "fail"
    idx = [torch.tensor([0, 1, 2])]
    assert judge_outputs(idx, idx, [torch.tensor([0, 1, 2])], "float32")["status"] == "pass"
    assert judge_outputs(idx, idx, [torch.tensor([0, 2, 1])], "float32")["status"] == "fail"
    # indices beside values are not judged (ties), the values are
    vals = torch.tensor([1.0, 1.0])
    out = judge_outputs([vals.double(), torch.tensor([0, 1])], [vals, torch.tensor([0, 1])],
                        [vals, torch.tensor([1, 0])], "float32")
    assert out["status"] == "pass" and out["output"] == 0


def test_nan_where_eager_has_a_number_fails():
    x = torch.linspace(-1, 1, 64)
    oracle, base, _ = _runs(torch.sin, x, torch.float32)
    wrong = base[0].clone()
    wrong[3] = float("nan")
    assert "non-finite" in judge_outputs(oracle, base, [wrong], "float32")["reason"]


def test_randomness_is_found_by_running():
    x = torch.ones(64)
    assert "random" in randomness(lambda t: torch.rand_like(t), Sample("opinfo", "0", "float32", [x]))
    calls = iter(range(10))
    assert "nondeterministic" in randomness(lambda t: t + next(calls), Sample("opinfo", "0", "float32", [x]))
    assert randomness(torch.sin, Sample("opinfo", "0", "float32", [x])) is None
    # a sparse (CSR) output repeats as its dense values: judged, not an error of ours
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    assert randomness(lambda t: (t * 0 + dense).to_sparse_csr(), Sample("opinfo", "0", "float32", [dense])) is None
    assert flat_outputs(dense.to_sparse_csr())[0].tolist() == dense.tolist()


def test_badness_orders_crashes_errors_and_margins():
    rows = [{"status": "pass", "backend_error": 1.0, "bound": 4.0}, {"status": "fail", "backend_error": 8.0, "bound": 4.0},
            {"status": "error"}, {"status": "crash"}, {"status": "skipped"}]
    ranked = sorted(rows, key=badness)
    assert [r["status"] for r in ranked] == ["skipped", "pass", "fail", "error", "crash"]
    assert badness({"status": "pass", "backend_error": 0.0, "bound": 0.0}) < badness(rows[1])
    assert badness({"status": "hang"}) == badness({"status": "crash"}) > badness({"status": "error"})
    assert flat_outputs((torch.ones(1), [2, 3.0])) is not None and flat_outputs("text") is None


def test_eager_identical_output_passes_where_nothing_finite_can_be_measured():
    x = torch.full((8,), 1e-45)  # subnormal: digamma overflows to -inf in float32, finite in float64
    oracle, base, same = _runs(torch.special.digamma, x, torch.float32)
    assert torch.isinf(base[0]).all() and torch.isfinite(oracle[0]).all()
    assert judge_outputs(oracle, base, same, "float32")["status"] == "pass"
    other = [torch.zeros(8)]
    assert judge_outputs(oracle, base, other, "float32")["status"] == "fail"


def test_a_failing_sample_outranks_every_passing_one_whatever_its_numbers():
    # the Inductor interpolate case: a sample that fails on a non-finite value alone has a small
    # RMSE over the finite ones, below a passing sample's error / bound
    passing = {"status": "pass", "backend_error": 6.8e-7, "bound": 1.6e-6, "reason": None}
    nonfinite = {"status": "fail", "backend_error": 9.5e-8, "bound": 4.6e-7,
                 "reason": "1 non-finite mismatch(es) against float64 eager (eager in float32 has 0)"}
    far = {"status": "fail", "backend_error": 8.0, "bound": 4.0, "reason": "RMSE ..."}
    assert max([passing, nonfinite], key=badness) is nonfinite
    assert max([passing, nonfinite, far], key=badness) is far
    assert badness({"status": "fail", "reason": "shape"}) > badness(far)  # unmeasured failures first


def test_a_failing_output_fails_the_sample_beside_a_passing_one_with_a_larger_ratio():
    x = torch.linspace(-1, 1, 64)
    o1, b1, _ = _runs(torch.sin, x, torch.float32)
    near = b1[0] + 1e-7 * torch.sign(b1[0])  # passes, but far closer to its bound than the one below
    o2, b2, _ = _runs(torch.cos, x, torch.float32)
    wrong = b2[0].clone()
    wrong[5] = float("inf")
    out = judge_outputs(o1 + o2, b1 + b2, [near, wrong], "float32")
    assert out["status"] == "fail" and out["output"] == 1 and "non-finite" in out["reason"]


def _bilinear(x):
    return torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")


def _inf_image() -> torch.Tensor:
    x = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    x[0, 0, 0, 0] = float("inf")  # the kernel skips its zero weights, the decomposition gives 0 x inf = NaN
    return x


def test_a_backend_computing_pytorchs_decomposition_passes_where_eagers_kernel_differs():
    from debug_framework.conformance.judge import decomposition, run_sample

    sample = Sample("special", "inf", "float32", [_inf_image()])

    def traced(*args):
        with decomposition():
            return _bilinear(*args)

    assert traced(*sample.args).isnan().any() and not _bilinear(*sample.args).isnan().any()
    out = run_sample(_bilinear, traced, sample)
    assert out["status"] == "pass" and out["definition"] == "decomposition"
    assert "non-finite" in out["kernel_reason"]
    kernel = run_sample(_bilinear, _bilinear, sample)  # eager's own result: no second look
    assert kernel["status"] == "pass" and "definition" not in kernel

    def nan_elsewhere(*args):  # wrong against both definitions
        y = traced(*args).clone()
        y[0, 0, 7, 7] = float("nan")
        return y

    assert run_sample(_bilinear, nan_elsewhere, sample)["status"] == "fail"

    def scaled(*args):  # a wrong lowering is wrong whatever the definition
        return traced(*args) * (1 + 1e-3)

    assert run_sample(_bilinear, scaled, sample)["status"] == "fail"


def test_an_error_the_decomposition_raises_too_is_skipped_another_is_an_error():
    from debug_framework.conformance.judge import decomposition, run_sample

    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
    x[1, 2] = float("inf")
    sample = Sample("special", "inf", "float32", [x])

    def traced(a):
        with decomposition():  # linalg.eigvals by way of linalg.eig, which rejects infinities
            return torch.linalg.eigvals(a)

    skipped = run_sample(torch.linalg.eigvals, traced, sample)
    assert skipped["status"] == "skipped" and "decomposition rejects" in skipped["reason"]

    def other_error(a):
        raise RuntimeError("my kernel is not ready")

    assert run_sample(torch.linalg.eigvals, other_error, sample)["status"] == "error"


def test_an_infinity_by_rounding_at_the_dtypes_largest_value_is_noise_elsewhere_a_failure():
    big = torch.finfo(torch.bfloat16).max
    oracle = [torch.tensor([0.9995 * big, 0.5 * big, 1.0], dtype=torch.float64)]
    base = [oracle[0].to(torch.bfloat16)]  # eager rounds to a finite value
    rounded_up = base[0].clone()
    rounded_up[0] = float("inf")  # a sum that rounded up past the largest value (Inductor's bfloat16 cumsum on a GPU)
    out = judge_outputs(oracle, base, [rounded_up], "bfloat16")
    assert out["status"] == "pass", out
    far = base[0].clone()
    far[1] = float("inf")  # half the largest value: no rounding reaches infinity
    assert "non-finite" in judge_outputs(oracle, base, [far], "bfloat16")["reason"]
    negative = base[0].clone()
    negative[0] = float("-inf")
    assert judge_outputs(oracle, base, [negative], "bfloat16")["status"] == "fail"
