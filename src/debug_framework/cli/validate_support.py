"""Helpers of ``debug_validate`` kept out of its command module: the argument checks that run before
anything heavy is imported, and the ``--verbose`` isolation table.

The checks import nothing but the standard library and the framework's light modules (errors,
config, storage paths), so ``--dtype float8`` or an unusable ``--database`` is refused in a fraction
of a second instead of after torch and the backends are imported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import FLOAT_DTYPES
from ..errors import ConfigurationError, DatabaseError, ModelLoadingError
from ..jsonio import JsonObject
from ..suggest import did_you_mean, one_of

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["check_dtype", "check_database_path", "check_model_path", "isolation_table", "reproduce_command_line"]


def parse_backend_options(given: Sequence[str]) -> JsonObject:
    """``--backend-option KEY=VALUE`` (repeatable) as keyword options of the backend: each KEY an
    identifier, each VALUE read as JSON where it parses (``3``, ``true``, ``null``, ``["a"]``), else
    kept as text (``bf16``).

    Raises:
        ConfigurationError: (DF005) an option without ``=``, or a KEY that is no identifier.
    """
    import json

    out: JsonObject = {}
    for item in given:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigurationError(f"--backend-option {item!r} is not KEY=VALUE",
                                     hint="e.g. --backend-option precision_hint=bf16")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def check_dtype(option: str, dtype: str | None) -> None:
    """``dtype`` is one of the framework's dtype names (or not given).

    Raises:
        ConfigurationError: an unknown name (DF005), with the closest known one.
    """
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ConfigurationError(f"{option} {dtype!r} is not a dtype the framework knows" + did_you_mean(dtype, FLOAT_DTYPES),
                                 hint=one_of(FLOAT_DTYPES))


def check_database_path(database: str | os.PathLike[str]) -> Path | None:
    """The session database file, checked as the engine will use it: a file path whose directory
    exists (it is created, as the engine would) and is writable, or an existing file. ``None`` for a
    ``postgresql://`` URL (the engine checks the server when it connects).

    Raises:
        DatabaseError: the path is a directory, or its directory cannot be created or written (DF003).
    """
    from ..storage.core import _checked_path  # path rules of the storage layer (light: no torch)
    from ..reports._common import shell_join
    from ..storage.postgres import is_server_url

    if is_server_url(os.fspath(database)):
        return None
    path = _checked_path(database)
    if path.is_dir():
        raise DatabaseError("the database path is a directory", database=str(path),
                            hint="pass a file path, e.g. --database runs/sessions.db")
    if not path.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        raise DatabaseError("cannot create the database: its directory is not writable", database=str(path),
                            hint="pass --database in a writable directory (or set PIE_DEBUG_DATABASE)")
    return path


def check_model_path(model_path: str) -> None:
    """The model path exists (the loader checks the rest after the heavy imports).

    Raises:
        ModelLoadingError: it does not (DF004).
    """
    from ..safefiles import path_exists

    if not path_exists(Path(model_path).expanduser(), error=ModelLoadingError,
                       hint="pass a shorter, existing model path"):
        raise ModelLoadingError("model path does not exist", file=str(model_path),
                                hint="pass a model directory (config.json + weights) or a weights file")


def _max_abs(metrics: dict[str, Any] | None) -> float | None:
    return None if not metrics else metrics.get("max_abs_error")


def isolation_table(result: dict[str, Any], fmt: Any) -> Table:
    """Per layer: the error its attention and MLP introduce on the reference's input, the error it
    carries in, the total, and whether it introduces error or only propagates it. ``fmt`` formats a number."""
    from rich.table import Table

    from .framework import add_row

    t = Table(title="isolation: each block alone on the reference's input to it (max abs error)")
    t.add_column("layer", justify="right")
    for col in ("attention introduces", "mlp introduces", "carried in", "total"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    for row in result.get("isolation") or []:
        introduces = bool(row.get("introduces_error"))
        verdict = "introduces error" + (f" ({row['block']})" if row.get("block") else "") if introduces else "propagates"
        add_row(t, row.get("layer"), fmt(_max_abs(row.get("attention"))), fmt(_max_abs(row.get("mlp"))),
                fmt(_max_abs(row.get("carried_in"))), fmt(_max_abs(row.get("total"))), verdict,
                style="red" if introduces else None)
    return t


#: ``debug_validate``'s options whose value is a local path (made absolute in the recorded command).
PATH_OPTIONS = ("--model-path", "--config-file", "--backend-file", "--plugin", "--database")
#: Options left out of the recorded command: where this run wrote its output is not part of the run.
_DROPPED_OPTIONS = ("--output-file",)


def reproduce_command_line(prog: str, argv: list[str], cwd: Path | None = None) -> str:
    """The shell command that reruns this invocation from any directory: ``prog`` and ``argv`` with every
    path option's value made absolute (``--database`` unless it is a server URL) and
    ``--output-file`` left out; with ``--backend-module`` (imported from the current directory) it
    starts with ``cd <this directory> &&``. Every option given is kept: user backends, plugin,
    config file, drill-down.
    """
    from ..reports._common import shell_join
    from ..storage.postgres import is_server_url

    here = (cwd or Path.cwd()).resolve()
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        if name in PATH_OPTIONS + _DROPPED_OPTIONS and name.startswith("--"):
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
            i += 1 if eq else 2
            if value is None or name in _DROPPED_OPTIONS:
                continue
            if not (name == "--database" and is_server_url(value)):
                value = str((here / Path(value).expanduser()).resolve())
            out += [name, value]
            continue
        out.append(token)
        i += 1
    line = shell_join([prog, *out])
    if any(a == "--backend-module" or a.startswith("--backend-module=") for a in argv):
        line = f"cd {shell_join([str(here)])} && {line}"
    return line
