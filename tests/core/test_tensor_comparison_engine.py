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
