"""Every console script's help says each thing once and in words (issue 30, item 9): no default
printed twice, no Python type as a placeholder, the same exit-code table at the end of every help
(and in the README, which lists every console script); ``debug_batch`` has the options of
``debug_validate`` a batch needs, checks its model paths first (exit 2) and counts outcomes."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest

from debug_framework.cli.framework import EXIT_CODES_HELP

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
_SUBCOMMANDS = {"inductor-debug": ["list", "analyze", "diff", "report", "minify", "clean"]}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _help(script: str, sub: list[str], capsys) -> str:
    module, _, func = SCRIPTS[script].partition(":")
    main = getattr(importlib.import_module(module), func)
    try:
        code = main([*sub, "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None), script
    return capsys.readouterr().out


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_help_ends_with_the_exit_codes_and_says_each_thing_once(script, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    for sub in [[]] + [[s] for s in _SUBCOMMANDS.get(script, [])]:
        text = _help(script, sub, capsys)
        flat = _flat(text)
        assert _flat(EXIT_CODES_HELP) in flat, (script, sub)
        assert not re.search(r"<(str|int|float|path|list\[[^>]*\]|int range|float range)>", text), (script, sub, text)
        # an option whose help states its default is not followed by click's [default: ...]
        for line in re.split(r"\n(?=\s*-)", text):
            if "(default" in line or "default:" in line.split("[default")[0]:
                assert "[default:" not in line, (script, sub, line)


def _command(script: str):
    """The click command of ``script`` as its help shows it (after :func:`plain_help`)."""
    import typer.main

    from debug_framework.cli.framework import plain_help

    module = importlib.import_module(SCRIPTS[script].partition(":")[0])
    app = getattr(module, "app", None) or module._app()
    return plain_help(typer.main.get_command(app))


def _options(command, path: list[str]):
    """(command path, option) for every visible option of ``command`` and its subcommands."""
    for sub_name, sub in getattr(command, "commands", {}).items():
        yield from _options(sub, [*path, sub_name])
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden and "--help" not in param.opts:
            yield path, param


_IDENTIFIER = re.compile(r"[\w~<>/.:,-]*[\w>][-_./:][\w<~][\w~<>/.:,-]*")


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_option_has_help_one_default_style_and_whole_identifiers_at_80_columns(script, capsys, monkeypatch):
    """Issue 48, item 12: each option of each command says what it is; its default is written
    ``(default: X)`` and only so; no option, id or file name in a help is broken across two lines."""
    monkeypatch.setenv("COLUMNS", "80")
    command = _command(script)
    texts: dict[tuple[str, ...], str] = {}
    for path, option in _options(command, []):
        assert (option.help or "").strip(), (script, path, option.opts)  # every option has help text
        if tuple(path) not in texts:
            texts[tuple(path)] = _help(script, path, capsys)
        text = texts[tuple(path)]
        assert "[default:" not in text, (script, path, text)
        assert not re.search(r"\(default(?!:)", text), (script, path, text)
        lines = text.splitlines()
        for token in _IDENTIFIER.findall(option.help):
            token = token.rstrip(".,:;")
            assert any(token in line for line in lines), (script, path, option.opts, token)


def test_the_help_formatter_breaks_lines_at_spaces_only():
    from debug_framework.cli.framework import HelpFormatter

    formatter = HelpFormatter(width=40)
    formatter.write_dl([("--output", "with --list (or a --diff without --output-format): JSON on stdout")])
    lines = formatter.getvalue().splitlines()
    assert any("--output-format" in line for line in lines), lines


def test_the_readme_lists_every_console_script_and_the_exit_codes():
    readme = (ROOT / "README.md").read_text()
    for script in SCRIPTS:
        assert f"| `{script}` |" in readme, script
    table = readme.split("| exit | meaning |")[1].split("\n\n")[0]
    for code in ("0", "1", "2", "3", "130"):
        assert f"\n| {code} |" in table


def test_debug_batch_has_the_validation_options(capsys):
    text = _flat(_help("debug_batch", [], capsys))
    for option in ("--backend-file", "--backend-module", "--dtype", "--drill-down", "--oracle"):
        assert option in text


def test_debug_batch_refuses_a_missing_model_path_with_exit_2(tmp_path, capsys):
    from debug_framework.cli.debug_batch import main

    models = tmp_path / "models.txt"
    models.write_text(f"{tmp_path / 'no-such-model'}\n", encoding="utf-8")
    assert main([str(models), "--database", str(tmp_path / "b.db")]) == 2
    assert "[DF004]" in capsys.readouterr().err
    assert main([str(models), "--dtype", "float8", "--database", str(tmp_path / "b.db")]) == 2


def test_debug_batch_counts_outcomes():
    from debug_framework.cli.debug_batch import outcome_counts

    rows = [{"status": "done", "verdict": "passed"}, {"status": "done", "verdict": "failed"},
            {"status": "done", "verdict": "passed"}, {"status": "failed", "verdict": None},
            {"status": "pending", "verdict": None}]
    assert outcome_counts(rows) == "2 passed, 1 failed, 1 error, 1 pending"
