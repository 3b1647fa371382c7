"""Lists never cut what a user needs (issue 48, item 8): every list of the CLI is a
:func:`fitted_table` whose id column is whole at 80 and 120 columns (the value ``--session-id`` or
``--run`` takes), a cell's line break is a line break (not a literal ``\\n``), and the columns that
tell runs apart (status, model, dtype) stay while less telling ones are left out and named."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from debug_framework.cli import session_report
from debug_framework.cli.tables import Column, fitted_table
from debug_framework.services.database_manager import DatabaseManager

MODEL = "/models/tiny-llama-with-a-rather-long-directory-name/model"


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def sessions_db(tmp_path):
    db = DatabaseManager(str(tmp_path / "s.db"))
    ids = []
    for dtype in ("bfloat16", "float32"):
        sid = db.create_session(MODEL, "python_reference", "pytorch", config={"dtype": dtype})
        db.update_session_status(sid, "running")
        ids.append(sid)
    return tmp_path / "s.db", ids


@pytest.mark.parametrize("width", [80, 120])
def test_session_list_keeps_ids_status_model_and_dtype_whole(sessions_db, width, capsys, monkeypatch):
    db, ids = sessions_db
    monkeypatch.setenv("COLUMNS", str(width))
    assert session_report.main(["--list", "--database", str(db)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    assert "\\n" not in out  # the backends' line break is a line break
    for sid in ids:
        assert re.search(rf"│ {sid} +│", out), (sid, out)  # whole, on one line
    rows = [line for line in out.splitlines() if any(sid in line for sid in ids)]
    assert "bfloat16" in rows[0] + rows[1] and "float32" in rows[0] + rows[1]  # the dtypes tell the runs apart
    assert "running" in out and "tiny-llama" in out  # status and model stay
    if width == 80:
        assert "left out at 80 columns: created (UTC)" in _flat(out)
    else:
        assert "python_reference" in out and "vs pytorch" in out


def test_an_id_column_is_never_left_out_even_with_a_keep_rank():
    cols = (Column("run", key=True, keep=0), Column("note", min_width=10, keep=1), Column("n", number=True))
    rows = [["20261128-142225-a1b2c3d4", "x" * 40, "12"]]
    console = Console(width=40, record=True, color_system=None)
    with console.capture() as cap:
        console.print(fitted_table(None, cols, rows, 40))
    out = cap.get()
    assert "20261128-142225-a1b2c3d4" in out and "…" not in out
    assert "left out at 40 columns: note" in _flat(out)


@pytest.mark.parametrize("width", [80, 120])
def test_inductor_debug_list_keeps_every_run_id_whole(artifacts_root, width, capsys, monkeypatch):
    from debug_module.cli import main

    monkeypatch.setenv("COLUMNS", str(width))
    with pytest.raises(SystemExit) as exit_info:
        main(["--root", str(artifacts_root["root"]), "list"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert max(len(line) for line in out.splitlines()) <= width
    for run in (artifacts_root["aot_run"], artifacts_root["kd_run"]):
        assert re.search(rf"│ {re.escape(run)} +│", out), (run, out)  # whole: the value --run takes
    assert "FAIL" in out and "…" not in out  # the KernelDiff verdict stays


@pytest.mark.parametrize("width", [80, 120])
def test_debug_batch_table_keeps_model_paths_whole(width, capsys, monkeypatch):
    from debug_framework.cli.debug_batch import _print_table

    monkeypatch.setenv("COLUMNS", str(width))
    paths = [f"{MODEL}-{n}" for n in range(2)]
    _print_table("batch-1", [{"item_index": n, "model_path": p, "status": "failed", "verdict": None,
                              "error": "DF004: the model directory has no config.json " * 2}
                             for n, p in enumerate(paths)])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    cells = [line.split("│")[2].strip() for line in out.splitlines() if line.startswith("│")]
    assert "".join(cells) == "".join(paths)  # each path whole (folded on a narrow terminal, never cut)
    assert out.count("failed") == 2 and "…" not in out
