"""``debug-dashboard`` / ``python -m debug_framework.dashboard``: start the Streamlit app.

    debug-dashboard [--database PATH|URL] [--artifacts DIR] [--port N] [--host 127.0.0.1]

Runs ``python -m streamlit run app.py`` headless, bound to ``--host`` (default 127.0.0.1: this
machine only), without usage statistics, with the settings in the app's environment. The exit code
is Streamlit's; 2 when the arguments are wrong or Streamlit is not installed (the ``dashboard`` extra).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..termtext import terminal_safe
from .settings import DEFAULT_ARTIFACTS, Settings, resolve_database

__all__ = ["main", "streamlit_command"]

APP = Path(__file__).with_name("app.py")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="debug-dashboard", description="The Streamlit dashboard over validation "
                                "sessions, batch jobs, plugins and debug_module runs (docs/dashboard.md).")
    p.add_argument("--database", help="SQLite file or postgresql:// URL (default: PIE_DEBUG_DATABASE or "
                   "~/.pie/debug/debug_framework.db)")
    p.add_argument("--artifacts", default=DEFAULT_ARTIFACTS, help="debug_module run directories (default: "
                   "./debug_artifacts)")
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    return p


def streamlit_command(host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line: headless, bound to ``host``, no usage statistics."""
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", host, "--server.port",
            str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--global.developmentMode", "false", "--client.toolbarMode", "viewer"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 < args.port < 65536:
        print(f"debug-dashboard: --port {args.port} is not a port (1-65535)", file=sys.stderr)
        return 2
    if importlib.util.find_spec("streamlit") is None:
        print("debug-dashboard: streamlit is not installed; pip install 'multi-backend-debug-framework[dashboard]'",
              file=sys.stderr)
        return 2
    settings = Settings(database=resolve_database(args.database), artifacts=Path(args.artifacts).expanduser().resolve())
    env = {**os.environ, **settings.environment()}
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    where = "this machine only" if args.host in ("127.0.0.1", "localhost", "::1") else "the network: anyone who can reach it can launch work"
    print(terminal_safe(f"debug-dashboard: http://{args.host}:{args.port} ({where}); database {settings.location}"),
          file=sys.stderr)
    try:
        return subprocess.call(streamlit_command(args.host, args.port), env=env)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
