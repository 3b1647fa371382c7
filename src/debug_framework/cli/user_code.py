"""User code named on a command line: ``pkg.mod`` or ``path/to/file.py``, imported before a command runs.

``debug_validate --backend-module pkg.mod --backend-file my_backend.py`` imports them so their
``register_backend(...)`` calls run (:func:`load_backend_code`); ``inductor-debug diff --model`` loads
a model factory from one (:func:`import_module_or_file`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from ..errors import ConfigurationError, DebugFrameworkError

__all__ = ["import_module_or_file", "import_file", "load_backend_code", "is_file_target"]


def is_file_target(target: str) -> bool:
    """True when ``target`` names a file (``x.py`` or a path with ``/``) rather than a module."""
    return target.endswith(".py") or "/" in target


def import_file(path: Path) -> ModuleType:
    """Execute the Python file ``path`` as a module of its own (a private name derived from its resolved
    path, registered in ``sys.modules`` so dataclasses and pickling work). Its exceptions propagate.

    Raises:
        FileNotFoundError: ``path`` is not a file.
    """
    file = path.expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no file {file}")
    name = "_df_user_" + hashlib.sha256(str(file).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_module_or_file(target: str) -> ModuleType:
    """``target`` imported: a file (:func:`is_file_target`) by :func:`import_file`, else a module with the
    current directory on ``sys.path`` (as ``python -m`` has it). Its exceptions propagate."""
    if is_file_target(target):
        return import_file(Path(target))
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(target)


def _load_one(load: Callable[[], object], what: str, context: dict[str, str]) -> None:
    try:
        load()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code failed to import: their error
        detail = exc.message if isinstance(exc, DebugFrameworkError) else f"{type(exc).__name__}: {exc}"
        raise ConfigurationError(f"{what}: importing it failed: {detail}",
                                 hint="fix the error in that code (run `python -c 'import ...'` to see the traceback); "
                                      "it should call debug_framework.backends.register_backend(name, factory)",
                                 **context) from exc


def load_backend_code(modules: Sequence[str] = (), files: Sequence[Path] = ()) -> list[str]:
    """Import each module and file (in that order) so the backends they register exist; returns the
    names registered by them.

    Raises:
        ConfigurationError: a module or file cannot be imported (DF005, naming it).
    """
    for file in files:  # before the registry (and torch) is imported: a typo fails fast
        if not file.expanduser().is_file():
            raise ConfigurationError(f"backend file {str(file)!r}: no such file",
                                     hint="give the path of a Python file that registers backends", file=str(file))
    from ..backends.registry import registered_backends

    before = set(registered_backends())
    for module in modules:
        if is_file_target(module):
            raise ConfigurationError(f"--backend-module {module!r} is a file path, not a module name",
                                     hint="use --backend-file for a .py file", module=module)
        _load_one(lambda m=module: import_module_or_file(m), f"backend module {module!r}", {"module": module})
    for file in files:
        _load_one(lambda f=file: import_file(Path(f)), f"backend file {str(file)!r}", {"file": str(file)})
    return [name for name in registered_backends() if name not in before]
