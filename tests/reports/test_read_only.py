"""``session_report`` only reads: rows whose JSON is damaged still render (every format and
``--list``), and a database it reads is left byte for byte as it was (no switch to WAL, no
migration), even a file of an older schema version."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from debug_framework.cli.session_report import main
from debug_framework.errors import DatabaseError
from debug_framework.services.database_manager import SCHEMA_VERSION, DatabaseManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "storage"))
from test_migrations import V1_SQL  # noqa: E402  (the hand-written first-release file)


def _damage(path: Path, session_id: str) -> None:
    conn = sqlite3.connect(str(path))
    with conn:
        conn.execute("UPDATE sessions SET config = '{bad', results = '[1,' WHERE session_id = ?", (session_id,))
        conn.execute("UPDATE checkpoint_results SET metrics_json = 'nope{' WHERE session_id = ? AND layer = 1"
                     " AND checkpoint = 'post_mlp'", (session_id,))
        conn.execute("UPDATE tensor_recordings SET metadata = '{' WHERE session_id = ?", (session_id,))
    conn.close()


def test_rows_with_damaged_json_render_in_every_format(db, build, tmp_path, capsys):
    b = build(db)
    other = build(db, seed=1)
    _damage(db.database_path, b.session_id)
    dbp = str(db.database_path)
    session = db.get_session(b.session_id)
    assert session["config"] is None and session["damaged_json"] == ["config", "results"]
    row = next(r for r in db.get_checkpoint_results(b.session_id) if (r["checkpoint"], r["layer"]) == ("post_mlp", 1))
    assert row["damaged_json"] == ["metrics_json"] and row["max_abs_error"] > 0  # the metric columns survive

    assert main(["--list", "--json", "--database", dbp]) == 0
    listed = {it["session_id"]: it for it in json.loads(capsys.readouterr().out)}
    assert set(listed) == {b.session_id, other.session_id}
    assert main(["--list", "--database", dbp]) == 0
    assert b.session_id[:8] in capsys.readouterr().out
    for fmt in ("json", "csv", "junit"):
        assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", fmt]) == 0, fmt
        assert "post_mlp" in capsys.readouterr().out
    page = tmp_path / "r.html"
    assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "html", "--include-tensors",
                 "--output-file", str(page)]) == 0
    html = page.read_text()
    assert 'id="damaged"' in html and "session.config" in html and "post_mlp:1.metrics_json" in html
    assert main(["--diff", other.session_id, b.session_id, "--database", dbp, "--json"]) in (0, 1)


def _snapshot(path: Path) -> tuple[bytes, int, list[str]]:
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


def test_reading_never_writes_the_database(db, build, tmp_path, capsys):
    """A foreign database in rollback-journal mode stays so; nothing beside it appears."""
    b = build(db)
    good = build(db, seed=1, bug_layer=None)
    db.close()
    path = db.database_path
    conn = sqlite3.connect(str(path))
    assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    conn.close()
    before = _snapshot(path)
    dbp = str(path)
    assert main(["--list", "--database", dbp]) == 0
    assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "html"]) == 0
    assert main(["--diff", good.session_id, b.session_id, "--database", dbp]) == 1
    capsys.readouterr()
    assert _snapshot(path) == before
    assert path.read_bytes()[18:20] == b"\x01\x01"  # the header still says rollback journal, not WAL (2)

    ro = DatabaseManager.open_read_only(path)  # and the API refuses writes instead of making them
    with pytest.raises(DatabaseError, match="read-only"):
        ro.update_session_status(b.session_id, "error")
    assert ro.get_session(b.session_id)["status"] == "failed"
    ro.close()
    assert _snapshot(path) == before


def test_an_older_file_is_read_through_a_migrated_copy(tmp_path, capsys):
    path = tmp_path / "old" / "v1.db"
    path.parent.mkdir()
    conn = sqlite3.connect(str(path))
    conn.executescript(V1_SQL)
    conn.close()
    before = _snapshot(path)
    assert main(["--list", "--json", "--database", str(path)]) == 0
    assert {it["session_id"] for it in json.loads(capsys.readouterr().out)} == {"s1", "s2"}
    assert main(["--session-id", "s1", "--database", str(path), "--output-format", "csv"]) == 0
    assert "post_processing" in capsys.readouterr().out
    assert _snapshot(path) == before
    db = DatabaseManager.open_read_only(path)
    assert db.source_path == path.resolve() and db.database_path != db.source_path
    assert db.schema_version() == SCHEMA_VERSION and db.get_session("s1")["status"] == "failed"
    copy_dir = db.database_path.parent
    del db
    import gc

    gc.collect()
    assert not copy_dir.exists()  # the temporary copy goes with the manager


def test_a_database_on_a_read_only_file_system_can_be_reported_on(db, build, tmp_path, capsys):
    """A foreign database in rollback-journal mode on a read-only mount (root bypasses file modes,
    so the mount is what makes it read-only; skipped where mounting is not allowed)."""
    import os
    import subprocess

    b = build(db)
    db.close()
    conn = sqlite3.connect(str(db.database_path))
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(db.database_path.parent), str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        dbp = str(mnt / db.database_path.name)
        assert main(["--list", "--json", "--database", dbp]) == 0
        assert b.session_id in capsys.readouterr().out
        assert main(["--session-id", b.session_id, "--database", dbp, "--output-format", "junit"]) == 0
        assert "post_mlp" in capsys.readouterr().out
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
