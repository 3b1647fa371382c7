"""The docs' examples run as written; run directories are unique and fully listed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from debug_module.artifacts import SUBDIRS, RunDirectory

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _doctest_blocks(name: str) -> list[str]:
    text = (DOCS / name).read_text()
    return re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", text, re.S)


@pytest.mark.slow
@pytest.mark.parametrize("doc", ["torch-compile-debugging.md", "adapters.md"])
def test_doc_examples_run(doc, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = _doctest_blocks(doc)
    assert blocks, f"no doctest block in {doc}"
    for code in blocks:
        exec(compile(code, f"{doc}", "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    assert "violation" in out


def test_run_directories_are_unique_and_manifest_lists_every_file(tmp_path):
    a = RunDirectory(tmp_path, backend="t")
    b = RunDirectory(tmp_path, backend="t")
    assert a.path != b.path and a.run_id != b.run_id
    assert all((a.path / s).is_dir() for s in SUBDIRS)
    a.write_text("aot_graphs/g.py", "print(1)\n", kind="aot_graph", graph="g")
    a.write_json("reports/r.json", {"x": 1}, kind="constraint_report")
    m = RunDirectory.load_manifest(a.path)
    assert [f["path"] for f in m["files"]] == ["aot_graphs/g.py", "reports/r.json"]
    assert m["files"][0]["bytes"] == len("print(1)\n") and len(m["files"][0]["sha256"]) == 64
    assert RunDirectory.load_manifest(b.path)["files"] == []
    with pytest.raises(ValueError):
        a.write_text("../escape.txt", "x", kind="x")
