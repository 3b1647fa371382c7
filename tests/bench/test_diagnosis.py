"""bench_diagnosis runs end to end (one seed, one family, no compiled backends) and prints both judges side by side."""

import pytest

from benchmarks import bench_diagnosis


@pytest.mark.slow
def test_quick_run_prints_both_judges(capsys):
    assert bench_diagnosis.main(["--quick", "--family", "qwen2"]) == 0
    out = capsys.readouterr().out
    assert "defaults (calibrated)" in out and "allclose @ torch.testing" in out
    line = next(x for x in out.splitlines() if x.startswith("defaults (calibrated)"))
    assert line.count("100.0 %") == 2 and "0.0 % (0/" in line  # detected, localized; no false alarm


def test_usage_error():
    with pytest.raises(SystemExit):
        bench_diagnosis.main(["--seeds", "0"])
