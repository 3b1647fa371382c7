"""No raw control or bidi character reaches the terminal (issue 33, item 6): user-controlled strings
(paths, session ids, job ids, backend names, option values) go through the one formatter,
``debug_framework.termtext.terminal_safe``, on every CLI's error, table, progress and summary path."""

from __future__ import annotations

import pytest

from debug_framework.cli import debug_batch, debug_validate, plugin_compile, session_report
from debug_framework.cli.framework import Failure, literal, markup
from debug_framework.errors import ConfigurationError
from debug_framework.termtext import terminal_safe

#: An OSC 8 hyperlink, a colour, BEL, backspace, carriage return, a right-to-left override, an isolate,
#: a C1 control (CSI), DEL and a line separator: each one changes what a terminal shows.
HOSTILE = "x\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\x1b[31mred\x08\r\u202eexe.doc\u2066\x9b2J\x7f\u2028z"
RAW = set("\x1b\x07\x08\r\u202e\u2066\x9b\x7f\u2028\x00")


def _clean(text: str) -> bool:
    return not (RAW & set(text))


def test_terminal_safe_escapes_and_keeps_the_rest():
    assert terminal_safe("ok é 漢字 🙂 path/a b") == "ok é 漢字 🙂 path/a b"
    shown = terminal_safe(HOSTILE + "\x00\n\t")
    assert _clean(shown) and "\\x1b]8;;http" in shown and "\\u202e" in shown and "\\x00\\n\\t" in shown
    assert terminal_safe("a\nb\tc\x1b", multiline=True) == "a\nb\tc\\x1b"
    assert terminal_safe(shown) == shown  # idempotent: escaping twice changes nothing


def test_helpers_escape_user_text():
    assert _clean(str(literal(HOSTILE))) and _clean(markup("[bold]{}[/]", HOSTILE))
    line = Failure.from_framework_error(ConfigurationError(HOSTILE, file=HOSTILE, hint=HOSTILE)).line("prog")
    assert line.startswith("prog: [DF005]") and _clean(terminal_safe(line))


@pytest.fixture
def hostile_dir(tmp_path):
    folder = tmp_path / HOSTILE.replace("/", "_")
    folder.mkdir()
    return folder


def test_error_paths_of_every_cli(tmp_path, hostile_dir, capsys):
    db = str(tmp_path / "s.db")
    runs = [
        (debug_validate.run, ["--model-path", str(hostile_dir / "missing"), "--database", db]),
        (debug_validate.run, ["--model-path", str(hostile_dir), "--dtype", HOSTILE, "--database", db]),
        (debug_validate.run, ["--model-path", str(hostile_dir), "--layers", HOSTILE, "--database", db]),
        (debug_validate.run, ["--model-path", HOSTILE + "\x00", "--database", db]),
        (debug_validate.run, ["--model-path", str(hostile_dir), "--seed", HOSTILE]),  # click's usage error
        (session_report.main, ["--session-id", HOSTILE, "--database", str(hostile_dir / "none.db")]),
        (session_report.main, ["--list", "--status", HOSTILE, "--database", db]),
        (debug_batch.main, [str(hostile_dir / "list.txt")]),
        (debug_batch.main, [str(hostile_dir / "list.txt"), "--executor", HOSTILE]),
        (plugin_compile.main, ["--plugin-path", str(hostile_dir / "plugin.json"), "--database", db]),
    ]
    for fn, argv in runs:
        rc = fn(argv)
        out = capsys.readouterr()
        assert rc == 2, (argv, out.err)
        assert _clean(out.out) and _clean(out.err), (argv, out.err)
        assert "internal error" not in out.err


def test_inductor_debug_error_path(hostile_dir, capsys):
    from debug_module.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--root", str(hostile_dir), "analyze", "--run", HOSTILE])
    out = capsys.readouterr()
    assert info.value.code in (1, 2) and _clean(out.out) and _clean(out.err), out.err


def test_debug_batch_table(tmp_path, hostile_dir, capsys):
    listing = tmp_path / "models.txt"
    (hostile_dir / "model").mkdir()  # no model files in it: the item's session fails with DF004
    listing.write_text(str(hostile_dir / "model") + "\n")
    db = str(tmp_path / "b.db")
    rc = debug_batch.main([str(listing), "--database", db, "--job-id", HOSTILE.replace("\u2028", "")])
    out = capsys.readouterr()
    assert rc == 1 and "\\x1b" in out.out, out.out + out.err  # the row is there, escaped
    assert _clean(out.out) and _clean(out.err)
