"""``--output-file`` of every report writer: a symlink or a special file is refused (DF005, exit 2)
and left as it was, ``-`` is standard output, and a write goes through a temporary file."""

from __future__ import annotations

import json
import os
import stat

import pytest

from debug_framework.cli import debug_validate, session_report
from debug_framework.errors import ConfigurationError
from debug_framework.models._common import write_report_file


@pytest.fixture
def specials(tmp_path):
    """A FIFO, a symlink to a file, a symlink to /dev/null, a directory, and /dev/null itself."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    devlink = tmp_path / "dev.json"
    devlink.symlink_to("/dev/null")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"fifo": fifo, "link": link, "devlink": devlink, "folder": folder, "dev": "/dev/null", "target": target}


@pytest.mark.parametrize("kind", ["fifo", "link", "devlink", "folder", "dev"])
def test_session_report_refuses_special_outputs(db, build, specials, capsys, kind):
    b = build(db, bug_layer=None, record=False)
    path = specials[kind]
    before = os.lstat(path)
    rc = session_report.main(["--session-id", b.session_id, "--database", str(db.database_path),
                              "--output-file", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "[DF005]" in err and "--output-file" in err
    after = os.lstat(path)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert specials["target"].read_text() == "keep me"


@pytest.mark.parametrize("kind", ["fifo", "link", "dev"])
def test_debug_validate_refuses_special_outputs_before_any_work(specials, tmp_path, capsys, kind):
    rc = debug_validate.run(["--model-path", str(tmp_path / "no-model"), "--output-file", str(specials[kind]),
                             "--database", str(tmp_path / "s.db")])
    err = capsys.readouterr().err
    assert rc == 2 and "[DF005]" in err and "only a regular file is replaced" in err
    assert not (tmp_path / "s.db").exists()  # refused before the database was created


def test_dash_is_stdout(db, build, capsys):
    b = build(db, bug_layer=1, record=False)
    assert session_report.main(["--session-id", b.session_id, "--database", str(db.database_path),
                                "--output-file", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["session_id"] == b.session_id
    assert "wrote" not in captured.err


def test_debug_validate_dash_and_json_conflict(tmp_path, capsys):
    assert debug_validate.run(["--model-path", str(tmp_path), "--output-file", "-", "--json"]) == 2
    assert "both write to standard output" in capsys.readouterr().err


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    out.write_text("old")

    def boom(*a, **k):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(ConfigurationError):
        write_report_file(out, "new")
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_name_too_long_is_a_df_error(tmp_path):
    with pytest.raises(ConfigurationError, match="longer than the file system allows"):
        write_report_file(tmp_path / ("x" * 5000), "text")
