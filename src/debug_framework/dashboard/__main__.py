"""``debug-dashboard`` / ``python -m debug_framework.dashboard``: start the Streamlit app.

    debug-dashboard [--database PATH|URL] [--artifacts DIR] [--port N] [--host 127.0.0.1]

Runs ``python -m streamlit run app.py`` headless, bound to ``--host`` (default 127.0.0.1: this
machine only), without usage statistics, with the settings in the app's environment. SIGTERM and
SIGHUP are forwarded to the Streamlit server, which is waited for (and killed when it does not stop
within :data:`STOP_GRACE_S`), so stopping the launcher frees the port. Exit codes are the project's
(:data:`debug_framework.cli.framework.EXIT_CODES_HELP`): 0 the server stopped cleanly (a SIGTERM
included), 2 the arguments are wrong or Streamlit is not installed (the ``dashboard`` extra), 130
Ctrl-C; a server that fails on its own gives 2.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import typer

from ..cli.framework import CliError, make_app
from ..termtext import terminal_safe
from .settings import DEFAULT_ARTIFACTS, Settings, resolve_database

__all__ = ["main", "streamlit_command", "serve", "STOP_GRACE_S"]

APP = Path(__file__).with_name("app.py")
#: Seconds the server has to stop after a forwarded signal before it is killed.
STOP_GRACE_S = 10.0


def streamlit_command(host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line: headless, bound to ``host``, no usage statistics."""
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", host, "--server.port",
            str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--global.developmentMode", "false", "--client.toolbarMode", "viewer"]


def _app() -> typer.Typer:
    about = "The Streamlit dashboard over validation sessions, batch jobs, plugins and debug_module runs " \
            "(docs/dashboard.md)."
    app = make_app(about)

    @app.command(help=about)
    def launch(
        database: str | None = typer.Option(None, "--database", help="SQLite file or postgresql:// URL (default: "
                                            "PIE_DEBUG_DATABASE or ~/.pie/debug/debug_framework.db)"),
        artifacts: str = typer.Option(str(DEFAULT_ARTIFACTS), "--artifacts",
                                      help="debug_module run directories (default: ./debug_artifacts)"),
        port: int = typer.Option(8501, "--port", help="port"),
        host: str = typer.Option("127.0.0.1", "--host",
                                 help="address to bind (default: 127.0.0.1, this machine only)"),
    ) -> int:
        if not 0 < port < 65536:
            raise CliError(f"--port {port} is not a port (1-65535)")
        if importlib.util.find_spec("streamlit") is None:
            raise CliError("streamlit is not installed; pip install 'multi-backend-debug-framework[dashboard]'")
        settings = Settings(database=resolve_database(database), artifacts=Path(artifacts).expanduser().resolve())
        env = {**os.environ, **settings.environment()}
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        where = "this machine only" if host in ("127.0.0.1", "localhost", "::1") else \
            "the network: anyone who can reach it can launch work"
        print(terminal_safe(f"debug-dashboard: http://{host}:{port} ({where}); database {settings.location}"),
              file=sys.stderr)
        return serve(streamlit_command(host, port), env)

    return app


def main(argv: Sequence[str] | None = None) -> int:
    """``debug-dashboard``: the project's CLI framework (its help style, exit codes, ``--version``)."""
    from ..cli.framework import Invocation, run_app

    return run_app(_app(), Invocation("debug-dashboard"), argv)


def serve(command: list[str], env: dict[str, str]) -> int:
    """Run the server ``command`` until it ends; SIGTERM/SIGHUP to this process are forwarded to it
    and it is waited for (killed after :data:`STOP_GRACE_S`), Ctrl-C likewise. The exit code: 0
    when it stopped because it was asked to (or ended cleanly), 130 for Ctrl-C, else 2."""
    proc = subprocess.Popen(command, env=env)
    asked: list[int] = []

    def forward(signum: int, frame: object) -> None:
        asked.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the terminal sent SIGINT to the server too; make sure it ends
            asked.append(signal.SIGINT)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            code = _stop(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if asked and proc.poll() is None:
        code = _stop(proc)
    if signal.SIGINT in asked:
        return 130
    return 0 if asked or code == 0 else 2


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """Wait up to :data:`STOP_GRACE_S` for ``proc`` to end, then kill it; its exit code."""
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
