"""The Model Explorer manifest's ``command`` is quoted for bash (issue 33, item 9): a folder named
with spaces, quotes or ``$(...)`` stays one argument and never runs as code."""

from __future__ import annotations

import json
import shlex
import subprocess

from debug_framework.cli.session_report import main


def test_command_is_shell_quoted(db, build, tmp_path, capsys):
    b = build(db, bug_layer=1, record=False)
    out = tmp_path / "me $(touch pwned) 'q' `x`;y"
    assert main(["--session-id", b.session_id, "--database", str(db.database_path), "--model-explorer", str(out)]) == 0
    capsys.readouterr()
    command = json.loads((out / "manifest.json").read_text())["graphs"][0]["command"]
    argv = shlex.split(command)
    assert argv[0] == "model-explorer" and argv[1] == str(out / "checkpoints.json")
    assert argv[2].startswith("--node_data_paths=" + str(out)) and len(argv) == 3
    # bash reads it the same way: echo the words back without running anything
    echoed = subprocess.run(["bash", "-c", "printf '%s\\n' " + command.split(" ", 1)[1]], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert echoed == argv[1:] and not (tmp_path / "pwned").exists()
