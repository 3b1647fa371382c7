"""The dashboard's settings, passed from the launcher to the Streamlit app through the environment
(Streamlit runs the app script in its own process; the environment is what both see)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config import default_database_path, from_environment, is_server_url, merge_config

__all__ = ["DATABASE_VARIABLE", "ARTIFACTS_VARIABLE", "DEFAULT_ARTIFACTS", "Settings", "resolve_database"]

#: The launcher's ``--database`` as the app reads it (a file path or a ``postgresql://`` URL).
DATABASE_VARIABLE = "PIE_DEBUG_DASHBOARD_DATABASE"
#: The launcher's ``--artifacts`` (the root of ``debug_module`` run directories).
ARTIFACTS_VARIABLE = "PIE_DEBUG_DASHBOARD_ARTIFACTS"
DEFAULT_ARTIFACTS = "debug_artifacts"


def resolve_database(arg: str | None, environ: Mapping[str, str] | None = None) -> Path | str:
    """``arg`` (``~`` expanded; a server URL as given), else the configured database
    (``PIE_DEBUG_DATABASE``, else ``~/.pie/debug/debug_framework.db``): the rule every CLI uses."""
    if arg:
        return default_database_path({"database_path": arg})
    return default_database_path(merge_config(from_environment(environ)))


@dataclass(frozen=True)
class Settings:
    """What the app shows: the session database and the ``debug_module`` artifacts root."""

    database: Path | str
    artifacts: Path

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        artifacts = Path(env.get(ARTIFACTS_VARIABLE) or DEFAULT_ARTIFACTS).expanduser()
        return cls(database=resolve_database(env.get(DATABASE_VARIABLE), env), artifacts=artifacts)

    @property
    def location(self) -> str:
        """The database as shown to people (a server URL without its password)."""
        from ..cli.framework import redact_secrets

        return redact_secrets(str(self.database))

    @property
    def is_server(self) -> bool:
        return is_server_url(self.database)

    def environment(self) -> dict[str, str]:
        """These settings as the variables the app (and its workers) read."""
        return {DATABASE_VARIABLE: str(self.database), ARTIFACTS_VARIABLE: str(self.artifacts)}
