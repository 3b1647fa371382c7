"""debug_opsweep's usage errors: exit 2 with one line, before any sweep (fast)."""

from __future__ import annotations

import json

from debug_framework.cli.debug_opsweep import main


def test_unknown_dtype_and_missing_backend_file_exit_2(tmp_path, capsys):
    assert main(["--dtypes", "float32,float8", "--database", str(tmp_path / "s.db")]) == 2
    err = capsys.readouterr().err
    assert "unknown dtype 'float8'" in err and len(err.strip().splitlines()) == 1
    assert main(["--backend-file", str(tmp_path / "nope.py"), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "error" and "no such file" in doc["error"]["message"]
    (tmp_path / "b.py").write_text("backend = None\n")
    assert main(["--backend-file", f"{tmp_path / 'b.py'}:not-a-name"]) == 2
    assert "not a Python name" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()
