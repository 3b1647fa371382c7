"""The pytest plugin: check a backend against the reference inside a test (docs/pytest_plugin.md).

Registered through the ``pytest11`` entry point (``debug_framework``), so installing the package
enables it; ``-p debug_framework.integrations.pytest_plugin`` loads it explicitly, and
``-p no:debug_framework`` turns it off. ::

    def test_my_backend(backend_validator):
        backend_validator.assert_matches("models/tiny", "my_backend", dtype="float32")

    # or, anywhere in a test (the plugin routes it the same way):
    from debug_framework import assert_backend_matches
    assert_backend_matches("models/tiny", "my_backend", dtype="float32")

Options (command line, relative to the working directory; or ini keys ``df_database`` /
``df_report_dir``, relative to the ini file):

* ``--df-database PATH``: the session database (default: ``debug_framework.db`` in pytest's base
  temporary directory, so a test run never writes to ``~/.pie``);
* ``--df-report-dir DIR``: where each session's HTML report is written (default: ``df_reports``
  in pytest's base temporary directory).

Each test that ran a session gets properties (``df_session_id``, ``df_verdict``, ``df_report``,
``df_first_divergence``, ``df_culprit``, ``df_database``; JUnit XML ``<property>`` elements), a
``debug_framework`` section in its report, and a line in the terminal summary.

A mismatch is an ``AssertionError`` (:class:`~.backend_check.BackendMismatch`). A framework error
(bad model path, unknown backend, bad config: a ``DebugFrameworkError`` with its DF code) is left
as it is, never turned into an ``AssertionError``: the test fails with the DF error's type and
message, gets ``df_outcome=error`` and ``df_error_code`` properties, and the terminal summary lists
it under "framework errors (not numerical mismatches)".

Only ``pytest`` and the standard library are imported at import time: a plugin that fails to
import breaks every pytest run of every project that has the package installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["BackendValidator", "backend_validator", "pytest_addoption"]

_RUNS = pytest.StashKey[list]()          # config: [(nodeid, lines, error)] for the terminal summary
_LINES = pytest.StashKey[list]()         # item: its debug_framework report lines


def _terminal_safe(text: str) -> str:
    """``text`` with control and bidi characters escaped (imported when first needed: see above)."""
    from ..termtext import terminal_safe

    return terminal_safe(text)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("debug_framework", "backend validation (debug_framework)")
    group.addoption("--df-database", dest="df_database", default=None, metavar="PATH",
                    help="session database of assert_backend_matches (default: in pytest's base temp dir)")
    group.addoption("--df-report-dir", dest="df_report_dir", default=None, metavar="DIR",
                    help="directory for the sessions' HTML reports (default: in pytest's base temp dir)")
    parser.addini("df_database", "session database of assert_backend_matches", default=None)
    parser.addini("df_report_dir", "directory for the sessions' HTML reports", default=None)


def _setting(config: pytest.Config, name: str) -> Path | None:
    """The command-line value (relative to the working directory), else the ini value (relative
    to the ini file), else None."""
    given = config.getoption(name, default=None)
    if given:
        return Path(given).expanduser()
    value = config.getini(name)
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() or config.inipath is None else config.inipath.parent / path


class BackendValidator:
    """The ``backend_validator`` fixture: run sessions into this test run's database and report dir."""

    def __init__(self, config: pytest.Config, tmp_factory: pytest.TempPathFactory | None, node: pytest.Item) -> None:
        self._config, self._tmp, self._node = config, tmp_factory, node
        self._tmp_dir: Path | None = None

    def _base(self) -> Path:
        """pytest's base temporary directory (created on first use; a fresh temporary directory
        when the tmpdir plugin is disabled)."""
        if self._tmp is None:
            import tempfile

            if self._tmp_dir is None:
                self._tmp_dir = Path(tempfile.mkdtemp(prefix="debug_framework-"))
            return self._tmp_dir
        return self._tmp.getbasetemp()

    @property
    def database(self) -> Path:
        return _setting(self._config, "df_database") or self._base() / "debug_framework.db"

    @property
    def report_dir(self) -> Path:
        return _setting(self._config, "df_report_dir") or self._base() / "df_reports"

    def record(self, name: str, value: str) -> None:
        """Attach ``name=value`` to the test (user_properties: JUnit XML ``<property>``)."""
        self._node.user_properties.append((name, value))
        self._node.stash.setdefault(_LINES, []).append(f"{name}: {value}")

    def context(self) -> Any:
        from .backend_check import CheckContext

        return CheckContext(database=lambda: self.database, report_dir=lambda: self.report_dir,
                            record=self.record, label=self._node.name)

    def run(self, model_path: str | Path, backend: str, **kwargs: Any) -> Any:
        """Run a session; return its ``ValidationResult`` whatever the verdict (no assertion)."""
        from .backend_check import run_backend_check

        return run_backend_check(model_path, backend, database=self.database, report_dir=self.report_dir,
                                 **kwargs).result

    def assert_matches(self, model_path: str | Path, backend: str, **kwargs: Any) -> Any:
        """:func:`~debug_framework.integrations.backend_check.assert_backend_matches` into this run's
        database and report dir."""
        from .backend_check import assert_backend_matches

        return assert_backend_matches(model_path, backend, database=self.database, report_dir=self.report_dir,
                                      **kwargs)


def _validator(request: pytest.FixtureRequest) -> BackendValidator:
    has_tmp = request.config.pluginmanager.has_plugin("tmpdir")  # -p no:tmpdir must not break every test
    return BackendValidator(request.config, request.getfixturevalue("tmp_path_factory") if has_tmp else None,
                            request.node)


@pytest.fixture
def backend_validator(request: pytest.FixtureRequest) -> BackendValidator:
    """Run backend validation sessions in a test; see :class:`BackendValidator`."""
    return _validator(request)


@pytest.fixture(autouse=True)
def _debug_framework_check_context(request: pytest.FixtureRequest) -> Iterator[None]:
    """Route ``debug_framework.assert_backend_matches`` called in a test to this run's database and
    report dir, and its results to the test's report (resolves nothing until a check runs)."""
    from .backend_check import CHECK_CONTEXT

    token = CHECK_CONTEXT.set(_validator(request).context())
    try:
        yield
    finally:
        CHECK_CONTEXT.reset(token)


def _framework_error(excinfo: pytest.ExceptionInfo[BaseException] | None) -> Any:
    """The DebugFrameworkError a test raised, if any (imported only when a test failed)."""
    if excinfo is None:
        return None
    from ..errors import DebugFrameworkError

    return excinfo.value if isinstance(excinfo.value, DebugFrameworkError) else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    # old-style wrapper (any pluggy): this plugin is loaded through the pytest11 entry point for
    # every user of the package, whatever their pytest; ``wrapper=True`` needs pluggy >= 1.1
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":
        _annotate(item, call, report)


def _annotate(item: pytest.Item, call: pytest.CallInfo[None], report: Any) -> None:
    """The test's report carries the checks' lines (and a framework error, told apart)."""
    error = _framework_error(call.excinfo)
    if error is not None:
        item.user_properties += [("df_outcome", "error"), ("df_error_code", error.code)]
        report.user_properties = list(item.user_properties)
        item.stash.setdefault(_LINES, []).append(f"framework error (not a numerical mismatch): {error}")
    lines = item.stash.get(_LINES, None)
    if lines:
        report.sections.append(("debug_framework", "\n".join(_terminal_safe(ln) for ln in lines)))
        item.config.stash.setdefault(_RUNS, []).append((item.nodeid, lines, error))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    runs = config.stash.get(_RUNS, None)
    if not runs:
        return
    terminalreporter.section("debug_framework")
    for nodeid, lines, error in runs:
        fallback = f"framework error {error.code}" if error is not None else "no verdict"
        verdict = next((ln.split(": ", 1)[1] for ln in lines if ln.startswith("df_verdict: ")), fallback)
        report = next((ln.split(": ", 1)[1] for ln in lines if ln.startswith("df_report: ")), None)
        terminalreporter.write_line(_terminal_safe(f"{nodeid}: {verdict}" + (f"; HTML report: {report}" if report else "")))
    errors = [(nodeid, error) for nodeid, _lines, error in runs if error is not None]
    if errors:
        terminalreporter.write_line(f"framework errors (not numerical mismatches): {len(errors)}", red=True)
        for nodeid, error in errors:
            terminalreporter.write_line(_terminal_safe(f"  {nodeid}: {error}"))
