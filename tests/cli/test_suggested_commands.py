"""Every command the pages and docs suggest exists (issue 48, item 9): the runs page once suggested
``inductor-debug guards``, a subcommand that does not exist. Each command line quoted as code in
the docs and the README, and each one a dashboard page or an HTML report names, is parsed against the real CLI: its
console script, its subcommand, and each ``--option`` it names."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
import typer.main

from debug_framework.cli.framework import plain_help

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
#: Where commands are suggested to a user: the docs, and the texts of the pages and reports.
PAGES = [*sorted((ROOT / "src/debug_framework/dashboard").rglob("*.py")), ROOT / "src/debug_module/dashboard_page.py",
         *sorted((ROOT / "src/debug_module/reports").rglob("*.py")),
         *sorted((ROOT / "src/debug_framework/reports").rglob("*.py"))]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`|<code>(.*?)</code>|tag\(\"code\", \"([^\"]+)\"", re.S)


def _command(script: str):
    module = importlib.import_module(SCRIPTS[script].partition(":")[0])
    app = getattr(module, "app", None) or module._app()
    return plain_help(typer.main.get_command(app))


def _options(command) -> dict[str, bool]:
    """Each option of ``command`` -> whether it takes a value."""
    found = {o: not (p.is_flag or p.count) for p in command.params if p.param_type_name == "option"
             for o in (*p.opts, *p.secondary_opts)}
    return {**found, "-h": False, "--help": False, "--version": False}


def _code_spans(text: str) -> list[str]:
    """The code of ``text``: fenced blocks, backtick spans, ``<code>`` elements, ``tag("code", ...)``."""
    spans = []
    for m in _CODE.finditer(text):
        spans.extend(line for g in m.groups() if g for line in g.replace("\\\n", " ").splitlines())
    return spans


def _suggested() -> list[tuple[str, str]]:
    """(where, command line) for every code span that starts with a console script's name."""
    found = []
    names = "|".join(re.escape(s) for s in sorted(SCRIPTS, key=len, reverse=True))
    start = re.compile(rf"(?:^|[\s$(`'\">])({names})(?=\s|$)")
    for path in [*DOCS, *PAGES]:
        text = path.read_text(encoding="utf-8")
        # a page's every line is read (a caption suggests in prose too); a doc's code only
        for span in _code_spans(text) if path.suffix == ".md" else text.splitlines():
            for m in start.finditer(span):
                found.append((str(path.relative_to(ROOT)), re.split(r"[`\"<]", span[m.start(1):])[0]))
    return found


def _check(line: str) -> str | None:
    """What is wrong with the command ``line`` (None: its script, subcommand and options exist)."""
    words = line.split()
    command = _command(words[0])
    options = _options(command)
    value_next = False
    for word in words[1:]:
        if word in ("|", "&&", ";", ">", "2>&1") or word.startswith(("#", ">")):
            break
        if value_next or word in ("...", "[...]"):
            value_next = False
            continue
        sub = getattr(command, "commands", None)
        name = word.strip("[]").split("=")[0]
        if sub and not name.startswith("-") and re.fullmatch(r"[a-z][a-z-]*", name):
            if name not in sub:
                return f"no subcommand {name!r}"
            command = sub[name]
            options = {**options, **_options(command)}
            continue
        if re.fullmatch(r"--?[a-z][a-z0-9-]*", name):
            if name not in options:
                return f"no option {name}"
            value_next = options[name] and "=" not in word
    return None


def test_the_commands_quoted_are_found():
    found = _suggested()
    assert len(found) > 50  # the docs suggest many commands: the scan finds them
    assert any("inductor-debug analyze --type guards" in line for _, line in found)


@pytest.mark.parametrize("where", sorted({w for w, _ in _suggested()}))
def test_every_suggested_command_exists(where):
    wrong = [(line, why) for w, line in _suggested() if w == where for why in [_check(line)] if why]
    assert not wrong, wrong


def test_the_check_catches_a_command_that_does_not_exist():
    assert _check("inductor-debug guards") == "no subcommand 'guards'"
    assert _check("debug_batch models.txt --no-such-option") == "no option --no-such-option"
    assert _check("inductor-debug --root art analyze --type guards --model m:f") is None
