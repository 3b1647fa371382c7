"""Fixtures every test directory may use: a throwaway PostgreSQL server for the tests that run on
both database engines (docs/storage.md, "PostgreSQL").

``pg_server`` (one per test session) runs ``initdb`` + ``pg_ctl`` in a temporary folder on a free
loopback port (as the unprivileged ``nobody`` when the tests run as root: the server refuses root),
with password authentication over TCP; it skips, saying why, where the binaries or psycopg are
missing. ``pg_url`` gives each test a database of its own (``CREATE DATABASE``) and points
``PIE_DEBUG_ARTIFACT_ROOT`` at a temporary folder; ``any_db_path`` is parametrised over both engines.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# pytest-xdist's workers are given COLUMNS=80 and LINES=24 (by execnet); a plain run has neither: the
# CLI's tables then see the same width (piped: 120) whether the suite runs in one process or several
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)

# Triton fixes its mode (interpreted or compiled) at its first import, and Inductor may import it
# before a test loads a CPU Triton plugin: on a machine without a GPU the whole test process
# interprets, as a user of CPU Triton plugins is told to do (tests that need another mode, e.g.
# test_triton_modes_in_a_fresh_process, start their own process without it).
if not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# -- processes the test run starts ----------------------------------------------------------------------
# Every process started during the run inherits this token in its environment (tests pass
# {**os.environ, ...}); at the session's end :func:`pytest_sessionfinish` looks for live processes that
# carry it, so a server left behind (even one whose parent died and that init adopted) fails the run.
RUN_TOKEN_VARIABLE = "PIE_TEST_RUN_TOKEN"
# a fresh token per run (a suite run inside another keeps its own, never judging the outer run's processes)
os.environ[RUN_TOKEN_VARIABLE] = f"{os.getpid()}-{time.time_ns()}"
#: Helpers that end with the test process itself (they watch their parent): not a leftover server.
#: How long the end-of-run check waits for stopped servers to exit before it fails the run.
LEFTOVER_GRACE_S = 10.0
_PARENT_BOUND = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "compile_worker",
                 "torch._inductor", "pytest")


def _token_processes() -> dict[int, str]:
    """{pid: command line} of live processes (not this one, not zombies) that carry this run's token."""
    token = f"{RUN_TOKEN_VARIABLE}={os.environ[RUN_TOKEN_VARIABLE]}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            if token not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        if state != "Z":
            found[pid] = cmd
    return found


def _leftovers() -> dict[int, str]:
    """Token processes that would outlive the run: all but this process's own parent-bound helpers."""
    own = {pid: cmd for pid, cmd in _token_processes().items()}
    out = {}
    for pid, cmd in own.items():
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and any(mark in cmd for mark in _PARENT_BOUND):
            continue
        out[pid] = cmd
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process it started is still alive at its end (a server left behind); the
    processes are named on the terminal, then killed so they do not linger either."""
    if not Path("/proc/self/environ").exists() or os.environ.get("PIE_TEST_SKIP_LEFTOVER_CHECK"):
        return
    distributed = getattr(getattr(session.config, "option", None), "dist", "no") != "no"
    if distributed and not hasattr(session.config, "workerinput"):
        return  # pytest-xdist's controller: each worker checks the processes its own tests started
    end = time.monotonic() + LEFTOVER_GRACE_S  # a stopped server may take a moment to exit
    left = _leftovers()
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = _leftovers()
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) started by the tests outlived them (a test did not stop its server):"]
    lines += [f"  pid {pid}: {cmd[:200]}" for pid, cmd in sorted(left.items())]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if reporter is not None:
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@contextlib.contextmanager
def server_process(cmd: list[str], *, stop_timeout: float = 20.0, **popen: object) -> Iterator[subprocess.Popen]:
    """Start ``cmd`` as a server in a process group of its own and stop the whole group on exit
    (SIGTERM, then SIGKILL after ``stop_timeout``): a launcher's children (streamlit under
    ``python -m debug_framework.dashboard``) stop with it, whatever the launcher does with signals."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        stop_process_group(proc, stop_timeout)


def stop_process_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM to ``proc``'s process group (it leads one: ``start_new_session``), SIGKILL to what is
    left after ``timeout``; waits for ``proc``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:  # the group's other members (the launcher's children)
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)


@pytest.fixture
def start_server() -> Iterator[object]:
    """``start_server(cmd, **popen) -> Popen``: a server in its own process group, the group stopped
    after the test (:func:`server_process`)."""
    stack = contextlib.ExitStack()

    def start(cmd: list[str], **popen: object) -> subprocess.Popen:
        return stack.enter_context(server_process(cmd, **popen))

    with stack:
        yield start


_PASSWORD = "pie-test-secret"
_COUNTER = itertools.count()


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    password: str

    def url(self, dbname: str, password: str | None = None) -> str:
        return f"postgresql://postgres:{password or self.password}@{self.host}:{self.port}/{dbname}"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(base: Path) -> list[str]:
    """The command prefix that runs the server unprivileged (root: ``runuser -u nobody``)."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("PostgreSQL refuses to run as root and runuser is not available to drop privileges")
    try:
        shutil.chown(base, "nobody")
    except (LookupError, OSError) as exc:
        pytest.skip(f"PostgreSQL refuses to run as root and there is no 'nobody' user to run it as: {exc}")
    return [runuser, "-u", "nobody", "--"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found; scripts/setup.sh installs them")
    base = Path(tempfile.mkdtemp(prefix="pie-pg-"))  # not under pytest's 0700 tmp: the server user reads it
    prefix = _as_server_user(base)
    (base / "pw").write_text(_PASSWORD)
    os.chmod(base / "pw", 0o644)
    port = _free_port()
    data = base / "data"
    try:
        subprocess.run([*prefix, initdb, "-D", str(data), "-U", "postgres", "--pwfile", str(base / "pw"),
                        "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8"],
                       check=True, capture_output=True, timeout=120)
        opts = (f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
                " -c full_page_writes=off -c max_connections=300")
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-l", str(base / "log"), "-o", opts, "-w", "-t", "60",
                        "start"], check=True, capture_output=True, timeout=90)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"could not start a throwaway PostgreSQL server: {exc} {err.decode(errors='replace')[-300:]}")
    try:
        yield PgServer("127.0.0.1", port, _PASSWORD)
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty database on the test server; its files go under ``tmp_path/artifacts``."""
    import psycopg

    name = f"t{os.getpid()}_{next(_COUNTER)}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # a name made above, not user input
    monkeypatch.setenv("PIE_DEBUG_ARTIFACT_ROOT", str(tmp_path / "artifacts"))
    return pg_server.url(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_path(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """The database of a test that runs on both engines: a SQLite file, or a PostgreSQL URL."""
    if request.param == "sqlite":
        return tmp_path / "db" / "debug_framework.db"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def any_db(any_db_path: str | Path) -> Iterator[object]:
    """A DatabaseManager on :func:`any_db_path` (closed after the test)."""
    from debug_framework.services.database_manager import DatabaseManager

    manager = DatabaseManager(any_db_path)
    yield manager
    manager.close()


# -- a real browser: Playwright driving Debian's chromium (never a downloaded browser) -----------------

@dataclass
class BrowserPage:
    """A Playwright ``page`` and every console error / uncaught page error seen on it."""

    page: object
    errors: list[str]

    def scroll_overflow(self) -> int:
        """How many pixels the page scrolls horizontally (0: no horizontal page scroll)."""
        return int(self.page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))  # type: ignore[attr-defined]

    def screenshot(self, name: str) -> Path:
        """Save a full-page screenshot as a test artifact: ``test-artifacts/<name>.png`` at the repository
        root (git-ignored; CI keeps the folder), or under ``$DF_TEST_ARTIFACTS`` when set."""
        folder = Path(os.environ.get("DF_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "test-artifacts")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
        return path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """``tiny(family) -> path``: a tiny random model of ``benchmarks.models.tiny_transformers``
    (seed 0), built once per test session (tests/diff has a ``tiny`` of its own)."""
    from benchmarks.models.tiny_transformers import make_model

    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = make_model(family, tmp_path_factory.mktemp(family) / "hf", 0)
        return built[family]

    return get


@pytest.fixture(scope="session")
def _chromium() -> Iterator[object]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/setup.sh does it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(_chromium: object) -> Iterator[BrowserPage]:
    """A fresh 1400x900 page in headless chromium; ``.errors`` collects console errors and page errors
    (a test asserts it stays empty)."""
    context = _chromium.new_context(viewport={"width": 1400, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    try:
        yield BrowserPage(page, errors)
    finally:
        context.close()


# -- injected-bug backends (benchmarks/injected_bugs.py), shared by the judgement and drill-down tests ----

@pytest.fixture
def bug_backend() -> Iterator[object]:
    """``bug_backend(bug or None) -> name``: an eager transformers backend with ``bug`` in one layer
    (``benchmarks.injected_bugs.BUG_LAYER``), unregistered after the test."""
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # the bug cases live in `benchmarks` (bench_diagnosis uses them too)
        sys.path.insert(0, root)
    from benchmarks.injected_bugs import register_bug_backend
    from debug_framework.backends import unregister_backend

    names: list[str] = []

    def make(bug: str | None) -> str:
        names.append(register_bug_backend(bug))
        return names[-1]

    yield make
    for n in names:
        unregister_backend(n)


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt during the test, as in a terminal: a shell's background job
    (``cmd &``, e.g. CI started that way) inherits SIGINT ignored, and Python keeps it ignored."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True)
def _main_module_kept() -> Iterator[None]:
    """Streamlit's ``AppTest`` runs a page as ``__main__`` and leaves its temporary script there;
    a later test on the same worker that spawns processes (a batch job) would make each child run
    that script (``multiprocessing``'s spawn re-imports the parent's main). Put the real one back."""
    main = sys.modules.get("__main__")
    yield
    if main is not None and sys.modules.get("__main__") is not main:
        sys.modules["__main__"] = main
