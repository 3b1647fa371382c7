"""``session_report --list`` and ``--diff`` tables show a hostile model path escaped (issue 33, item 6)."""

from __future__ import annotations

from debug_framework.cli.session_report import main

HOSTILE = "/models/\x1b]8;;http://evil\x07x\x1b[2J\u202eexe.doc\r"


def test_list_and_report_escape_user_text(db, build, capsys):
    a = build(db, bug_layer=None, model_path=HOSTILE, record=False)
    b = build(db, bug_layer=1, model_path=HOSTILE, record=False)
    dbp = str(db.database_path)
    for argv in (["--list"], ["--diff", a.session_id, b.session_id], ["--session-id", HOSTILE]):
        main([*argv, "--database", dbp])
        out = capsys.readouterr()
        assert not set("\x1b\x07\u202e\r") & set(out.out + out.err), argv
    assert main(["--list", "--database", dbp]) == 0
    assert "\\x1b]8;;http" in capsys.readouterr().out
