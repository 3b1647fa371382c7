"""docs/served.md's example runs as written, and bench_served prints its figures."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from benchmarks import bench_served

DOC = Path(__file__).resolve().parents[2] / "docs" / "served.md"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.mark.slow  # a real llama-server and a validation
def test_the_docs_example_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bench_served.tiny_llama(tmp_path / "tiny-llama")
    (block,) = re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    exec(compile(block, str(DOC), "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    assert "exit code 0" in out and "PASSED" in out and "served: http://127.0.0.1:" in out


@pytest.mark.slow  # a real llama-server and a validation
def test_bench_served_prints_ours_beside_the_bare_requests(capsys):
    assert bench_served.main(["--batch", "1", "--length", "8", "--decode-steps", "2", "--repeats", "1", "--json"]) == 0
    import json

    figures = json.loads(capsys.readouterr().out)
    assert figures["verdict"] == "passed" and figures["requests"] == figures["positions"] == 8 + 2
    assert figures["bare_requests"] == 1 and figures["ratio_served_to_bare"] > 0
