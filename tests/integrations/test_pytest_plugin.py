"""The pytest plugin, run with ``pytester`` on a small test file against a tiny random BERT on disk:
a passing backend, a module backend with GELU's tanh approximation in layer 1 (the judgement
suite's injected bug), and two framework errors (a missing model, an unknown backend).

The plugin is loaded with ``-p debug_framework.integrations.pytest_plugin`` while this checkout is
not installed with its entry point (loading it by module while the entry point is active would
register it twice, which pytest refuses), and with the entry point otherwise.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest_plugins = ["pytester"]
PLUGIN = "debug_framework.integrations.pytest_plugin"


def _entry_point_installed() -> bool:
    return any(ep.name == "debug_framework" and ep.value == PLUGIN
               for ep in importlib.metadata.entry_points(group="pytest11"))


def _plugin_args() -> list[str]:
    return [] if _entry_point_installed() else ["-p", PLUGIN]


TESTS = '''
from debug_framework import assert_backend_matches
from benchmarks.injected_bugs import register_bug_backend
from debug_framework.backends import unregister_backend

MODEL = {model!r}


def test_correct_backend(backend_validator):
    result = backend_validator.assert_matches(MODEL, "pytorch", dtype="float32")
    assert result.verdict == "passed"


def test_gelu_bug():
    name = register_bug_backend("gelu_variant")
    try:
        assert_backend_matches(MODEL, name, dtype="float32")
    finally:
        unregister_backend(name)


def test_missing_model(backend_validator):
    backend_validator.assert_matches(MODEL + "_missing", "pytorch")


def test_unknown_backend():
    assert_backend_matches(MODEL, "no_such_backend")
'''


def _properties(xml: Path) -> dict[str, dict[str, str]]:
    """testcase name -> its JUnit <property> elements (repeated names joined by ' | ')."""
    out: dict[str, dict[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        props: dict[str, str] = {}
        for p in case.iter("property"):
            props[p.get("name")] = " | ".join(filter(None, (props.get(p.get("name")), p.get("value"))))
        out[case.get("name")] = props
    return out


@pytest.mark.slow  # a tiny BERT built and validated (seconds)
def test_plugin_fails_with_the_diagnosis_and_records_sessions_and_reports(pytester, tiny_bert, tmp_path):
    from debug_framework.services.database_manager import DatabaseManager

    pytester.makepyfile(test_backends=TESTS.format(model=str(tiny_bert)))
    db, reports, xml = tmp_path / "df.db", tmp_path / "reports", tmp_path / "junit.xml"
    run = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider", f"--df-database={db}",
                             f"--df-report-dir={reports}", f"--junitxml={xml}")
    run.assert_outcomes(passed=1, failed=3)
    text = run.stdout.str()

    # the mismatch: an AssertionError with the diagnosis
    bug = text[text.index("__ test_gelu_bug __"):text.index("__ test_missing_model __")]
    assert "BackendMismatch" in bug
    for expected in ("does not match 'python_reference'", "verdict failed", "first divergence: post_mlp:1",
                     "introducing layers: [1]", "error source: layer 1 (mlp)", "HTML report: "):
        assert expected in bug, expected
    assert "debug_framework" in bug and "df_report: " in bug  # the report section of the failed test

    # framework errors keep their DF type and code, and are listed apart from mismatches
    missing = text[text.index("__ test_missing_model __"):text.index("__ test_unknown_backend __")]
    assert "ModelLoadingError" in missing and "[DF004]" in missing and "BackendMismatch" not in missing
    assert "framework errors (not numerical mismatches): 2" in text
    assert "[DF002]" in text.split("framework errors (not numerical mismatches)")[1]

    props = _properties(xml)
    assert props["test_correct_backend"]["df_verdict"] == "passed"
    assert props["test_gelu_bug"]["df_verdict"] == "failed"
    assert props["test_gelu_bug"]["df_first_divergence"] == "post_mlp:1"
    assert props["test_missing_model"]["df_outcome"] == "error" and props["test_missing_model"]["df_error_code"] == "DF004"
    assert props["test_unknown_backend"]["df_error_code"] == "DF002"
    html = [Path(props[t]["df_report"]) for t in ("test_correct_backend", "test_gelu_bug")]
    assert all(p.parent == reports and p.is_file() and "<html" in p.read_text()[:500].lower() for p in html)
    assert sorted(reports.iterdir()) == sorted(html)

    sessions = DatabaseManager(db).list_sessions()
    assert sorted(s["status"] for s in sessions) == ["failed", "passed"]
    assert {s["session_id"] for s in sessions} == {props[t]["df_session_id"] for t in ("test_correct_backend", "test_gelu_bug")}
    summary = text.split("= debug_framework =")[1]
    assert "test_gelu_bug: failed; HTML report: " in summary and "test_missing_model: framework error DF004" in summary


@pytest.mark.slow  # a tiny BERT built and validated (seconds)
def test_ini_report_dir_and_the_default_database_in_pytests_temp_dir(pytester, tiny_bert):
    pytester.makepyfile(test_one=TESTS.format(model=str(tiny_bert)).split("def test_gelu_bug")[0])
    pytester.makeini("[pytest]\ndf_report_dir = ini_reports\n")
    run = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider", "--basetemp", str(pytester.path / "bt"))
    run.assert_outcomes(passed=1)
    assert (pytester.path / "bt" / "debug_framework.db").is_file()
    assert len(list((pytester.path / "ini_reports").glob("*.html"))) == 1


@pytest.mark.slow  # a tiny BERT built, validated and drilled (seconds)
def test_culprit_operator_is_in_the_message_when_a_drill_down_ran(bug_check):
    """The real message of a drilled session names the culprit as docs/pytest_plugin.md shows it."""
    import re

    from debug_framework.integrations.backend_check import failure_message

    _model, outcome = bug_check
    result = outcome.result
    assert result.verdict == "failed" and outcome.report.is_file() and result.drilldown
    message = failure_message(result, outcome.report, outcome.database)
    doc = (ROOT / "docs" / "pytest_plugin.md").read_text()
    (culprit,) = re.findall(r"E     (culprit operator .*?); repro: ", doc)
    line = re.sub(r"\\\.py:\d+", r"\\.py:\\d+", re.escape(culprit))  # the source line is transformers' version's
    assert re.search(line + "; repro: ", message), (culprit, message)
    assert "(verified)" in message and outcome.database in message and str(outcome.report) in message


def test_entry_point_is_declared_and_the_plugin_imports_without_torch():
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry == {"debug_framework": PLUGIN}
    code = f"import sys, {PLUGIN}; print([m for m in ('torch', 'numpy', 'debug_framework.services.validation_engine') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"
    for ep in importlib.metadata.entry_points(group="pytest11"):  # where installed, it is this module
        if ep.name == "debug_framework":
            assert ep.value == PLUGIN


@pytest.mark.slow  # a tiny BERT validated twice (seconds)
def test_docs_example_runs(pytester, tiny_bert):
    import re

    doc = (ROOT / "docs" / "pytest_plugin.md").read_text()
    (block,) = re.findall(r"<!-- doctest-pytest -->\s*```python\n(.*?)```", doc, re.S)
    assert '"path/to/model"' in block
    pytester.makepyfile(test_my_backend=block.replace('"path/to/model"', repr(str(tiny_bert))))
    pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_hook_wrappers_are_old_style_so_any_pluggy_loads_the_plugin():
    """The entry point loads the plugin for every user of the package: ``wrapper=True`` needs
    pluggy >= 1.1, ``hookwrapper=True`` works with every pluggy pytest has shipped with."""
    import importlib

    plugin = importlib.import_module(PLUGIN)
    hooks = {name: fn.pytest_impl for name, fn in vars(plugin).items() if hasattr(fn, "pytest_impl")}
    assert "pytest_runtest_makereport" in hooks
    assert all(not opts.get("wrapper") for opts in hooks.values()), hooks
    assert hooks["pytest_runtest_makereport"].get("hookwrapper") is True
