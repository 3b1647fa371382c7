import torch

from debug_framework.services.tensor_comparison_engine import TensorComparisonEngine


def test_front_delegates_to_core_and_speaks_dicts():
    eng = TensorComparisonEngine()
    ref = torch.ones(10)
    alt = ref.clone()
    alt[3] = 1.01
    out = eng.compare_tensors(ref, alt, {"rtol": 1e-4, "atol": 1e-6})
    assert out["match_status"] is False and abs(out["max_absolute_error"] - 0.01) < 1e-6
    assert out["tolerance_config"]["rtol"] == 1e-4 and out["worst"][0]["index"] == [3]
    ok = eng.compare_tensors(ref, alt, {"rtol": 0.02, "atol": 0})
    assert ok["match_status"] is True
    analysis = eng.analyze_differences(ref, alt)
    assert analysis["worst_elements"][0]["index"] == [3]
    assert abs(analysis["needed_rtol_at_atol_0"] - 0.01) < 1e-6
    ok["name"], out["name"] = "a", "b"
    report = eng.generate_comparison_report([ok, out])
    assert report["total"] == 2 and report["passed"] == 1 and report["failed_names"] == ["b"]


def test_tolerance_dict_layers_over_the_dtype_default_and_the_engine_default():
    from debug_framework.comparison import compare, default_tolerance

    ref = torch.ones(8, dtype=torch.float16)
    alt = ref.clone()
    alt[0] = 1.0009765625  # one float16 ULP
    eng = TensorComparisonEngine({"atol": 0.0, "equal_nan": True})
    out = eng.compare_tensors(ref, alt, {"rtol": 1e-4, "unknown": 1})  # unknown keys are ignored
    expected = default_tolerance(torch.float16).with_overrides(atol=0.0, equal_nan=True, rtol=1e-4)
    assert out["tolerance_config"] == expected.to_dict() and out["match_status"] is False
    core = compare(ref, alt, tolerance=expected, check_dtype=False).to_dict(json_compatible=True)
    assert {k: out[k] for k in core} == core  # every number is the core's
    assert eng.compare_tensors(ref, alt)["tolerance_config"]["rtol"] == default_tolerance(torch.float16).rtol
