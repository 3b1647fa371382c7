"""The sweep example of docs/plugins.md runs as written (on the session's build cache)."""

from __future__ import annotations

import re

import pytest

from .conftest import ROOT


@pytest.mark.slow
def test_plugins_doc_example(tmp_path, monkeypatch, capsys, buggy_build, build_cache):
    import debug_framework.services.compilation_engine as ce

    monkeypatch.setattr(ce, "DEFAULT_CACHE_DIR", build_cache)  # the build fixture already compiled it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (block,) = re.findall(r"<!-- doctest -->\s*```python\n(.*?)```", (ROOT / "docs" / "plugins.md").read_text(), re.S)
    exec(compile(block, "plugins.md", "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    assert re.search(r"rms_norm: \d+/\d+ samples pass; worst: (subnormal in x|values x 0.0001)", out), out
    assert "exceeds" in out and (tmp_path / "repros").is_dir() and "repro.py (verified)" in out
