"""One CLI family: every console script answers ``--version``, and one name per option meaning
across them (``-o/--output-file`` for a file written, ``-o/--output-dir`` for a folder,
``-f/--output-format``), the older spellings (the spec's ``--output-path``, ``inductor-debug``'s
``--output`` and ``--format``, ``debug_opsweep``'s ``--backend-file``) still read but not shown."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
import typer.main

from debug_framework.cli.framework import OPTION_ALIASES, canonical_args, package_version

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _main(script: str):
    module, _, func = SCRIPTS[script].partition(":")
    return getattr(importlib.import_module(module), func)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_script_answers_version(script, capsys):
    try:
        code = _main(script)(["--version"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    assert capsys.readouterr().out.strip() == f"{script} {package_version()}"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_no_script_shows_an_old_spelling(script, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    subs = {"inductor-debug": ["report", "minify", "diff", "analyze"]}.get(script, [])
    for sub in [[]] + [[s] for s in subs]:
        try:
            _main(script)([*sub, "--help"])
        except SystemExit:
            pass
        text = capsys.readouterr().out
        shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text))
        assert not shown & {"--output", "--output-path", "--format"}, (script, sub)
        assert "--version" in text


def test_old_spellings_become_the_canonical_option():
    from debug_framework.cli.debug_opsweep import app as opsweep
    from debug_module.cli import app as inductor

    group = typer.main.get_command(inductor)
    assert canonical_args(group, ["--root", "r", "report", "--format", "json", "--output=x.json"]) == [
        "--root", "r", "report", "--output-format", "json", "--output-file=x.json"]
    assert canonical_args(group, ["minify", "--output", "d", "--", "--format"]) == [
        "minify", "--output-dir", "d", "--", "--format"]
    sweep = typer.main.get_command(opsweep)
    assert canonical_args(sweep, ["--backend-file", "b.py:fn"]) == ["--compile-backend-file", "b.py:fn"]
    assert set(OPTION_ALIASES) == {"--output", "--output-path", "--format", "--backend-file"}


def test_the_spec_spelling_of_plugin_compile_still_works(tmp_path, capsys):
    from debug_framework.cli.plugin_compile import main

    code = main(["--plugin-path", str(tmp_path / "missing.json"), "--output-path", str(tmp_path / "out.bin")])
    err = capsys.readouterr().err
    assert code == 2 and "no such option" not in err.lower() and "missing.json" in err
