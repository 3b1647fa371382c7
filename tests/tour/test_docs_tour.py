"""docs/tour.md's example runs as written: ``--quick`` end to end, then its repro alone and the CLIs on
the tour's runs. Checks every step's artifacts and that the repro fails as promised."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from debug_module.demo.runner import STEP_NAMES

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: What each step must leave behind (labels of its artifacts).
EXPECTED_ARTIFACTS = {
    "constraints": {"run", "constraint reports"},
    "capture": {"run", "guards", "fx graph", "forward graph", "backward graph"},
    "inductor": {"run", "IR pre-fusion", "IR post-fusion", "output code"},
    "kerneldiff": {"run", "KernelDiff JSON"},
    "minifier": {"run", "repro", "repro inputs", "minifier summary"},
    "benchmark": {"benchmark JSON"},
    "report": {"HTML report", "JSON twin"},
    "cli": {"model for debug_validate"},
}


@pytest.mark.slow
def test_tour_doc_example_quick_run_every_step_and_its_repro(tmp_path):
    (block,) = re.findall(r"<!-- doctest-bash -->\s*```bash\n(.*?)```", (DOCS / "tour.md").read_text(), re.S)
    assert "python -m debug_module.demo --quick" in block
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", COLUMNS="200",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "tour"
    doc = json.loads((out / "tour.json").read_text())
    assert doc["schema"] == "debug_module.tour/1" and doc["exit_code"] == 0
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == list(STEP_NAMES)
    for name, step in steps.items():
        assert step["status"] == "ok", (name, step["lines"])
        assert EXPECTED_ARTIFACTS[name] <= set(step["artifacts"]), name
        for label, path in step["artifacts"].items():
            assert Path(path).exists(), (name, label, path)
    # real results: violations at the default alignment 8, a backward graph, generated kernels, a passing
    # KernelDiff, a benchmark with eager (the anchor) first, an HTML page
    assert "shape_alignment" in "\n".join(steps["constraints"]["lines"])
    assert any("backward graph" in line for line in steps["capture"]["lines"])
    assert list((Path(steps["inductor"]["artifacts"]["run"]) / "inductor_kernels").rglob("*.cpp"))
    assert "PASS" in steps["kerneldiff"]["lines"][0]
    bench = json.loads(Path(steps["benchmark"]["artifacts"]["benchmark JSON"]).read_text())
    assert [r["backend"] for r in bench["results"]] == ["eager", "inductor", "mock_backend"]
    assert "<html" in Path(steps["report"]["artifacts"]["HTML report"]).read_text().lower()
    # the repro ran alone (python -I, from the doc) and failed as promised: exit 1 with the denied op
    assert "repro exit 1" in p.stdout and "REPRO: reproduced: " in p.stdout and "aten.tanh.default" in p.stdout
    repro = Path(steps["minifier"]["artifacts"]["repro"])
    assert repro.is_relative_to(out / "runs")
    # the CLI step printed the commands with the tour's real paths; the CLIs read the tour's runs
    assert f"inductor-debug list --root {out / 'runs'}" in p.stdout and f"python {repro}" in p.stdout
    assert "runs under tour/runs" in p.stdout and (out / "report-again.html").is_file()
