"""The pytest plugin's terminal summary shows a hostile model path escaped (issue 33, item 6)."""

from __future__ import annotations

import importlib.metadata

pytest_plugins = ["pytester"]
PLUGIN = "debug_framework.integrations.pytest_plugin"

TEST = '''
def test_missing_model(backend_validator):
    backend_validator.assert_matches({path!r}, "pytorch")
'''


def test_summary_escapes_control_characters(pytester, tmp_path):
    installed = any(ep.name == "debug_framework" and ep.value == PLUGIN
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    path = str(tmp_path / "m\x1b]8;;http://evil\x07odel\x1b[2J\u202eexe.doc")
    pytester.makepyfile(test_hostile=TEST.format(path=path))
    run = pytester.runpytest(*([] if installed else ["-p", PLUGIN]), "-p", "no:cacheprovider",
                             f"--df-database={tmp_path / 'd.db'}", "-rN")
    run.assert_outcomes(failed=1)
    text = "\n".join(run.outlines + run.errlines)
    summary = text[text.index("= debug_framework ="):]
    assert "framework errors (not numerical mismatches): 1" in summary and "\\x1b]8;;http" in summary
    assert not set("\x1b\x07\u202e") & set(text)  # the DF error's own message is escaped too
