"""Reading a WAL-mode session database read-only (session_report, the dashboard's viewer) creates
no ``-wal``/``-shm`` files beside it (issue 33, item 9), and still sees a writer's rows."""

from __future__ import annotations

from debug_framework.cli.session_report import main
from debug_framework.storage.database import Database


def _beside(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))


def test_read_only_opens_create_no_files(db, build, capsys):
    b = build(db, bug_layer=None, record=False)
    db.close()
    path = db.database_path
    assert path.read_bytes()[18:20] == b"\x02\x02"  # the header says WAL
    assert _beside(path) == [path.name]
    assert main(["--list", "--database", str(path)]) == 0
    assert main(["--session-id", b.session_id, "--database", str(path)]) == 0
    ro = Database.open_read_only(path)  # what the dashboard's viewer opens
    assert ro.sessions.get(b.session_id)["session_id"] == b.session_id
    ro.close()
    capsys.readouterr()
    assert _beside(path) == [path.name]


def test_a_reader_beside_a_writer_sees_its_rows(db, build):
    build(db, bug_layer=None, record=False)  # the writer keeps its connection (and its -wal) open
    second = build(db, bug_layer=1, record=False, seed=3)
    ro = Database.open_read_only(db.database_path)
    assert ro.sessions.get(second.session_id)["session_id"] == second.session_id
    ro.close()
