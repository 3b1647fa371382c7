"""A function named by the user in a backend option: ``"package.module:function"`` or
``"path/to/file.py:function"`` (ONNX Runtime's ``graph_transform``, Inductor's ``compiler``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["is_function_spec", "load_user_function"]


def is_function_spec(value: object) -> bool:
    """Whether ``value`` is a ``"module:function"`` / ``"file.py:function"`` string."""
    return isinstance(value, str) and ":" in value


def load_user_function(spec: str, backend: str, option: str) -> Callable[..., Any]:
    """The function ``spec`` names: ``"package.module:function"`` (imported) or
    ``"path/to/file.py:function"`` (an existing ``.py`` file, loaded as a module of its own and kept
    in ``sys.modules``, so a minifier repro can find its source file).

    Raises:
        BackendInitializationError: ``spec`` is malformed, the module or file cannot be loaded, or
            it has no callable of that name (DF002).
    """
    import importlib
    import importlib.util

    from ..errors import BackendInitializationError

    target, _, attr = str(spec).rpartition(":")
    hint = f"{option} is 'package.module:function' or 'path/to/file.py:function'"
    if not target or not attr.isidentifier():
        raise BackendInitializationError(f"{option} {spec!r} does not name a function", hint=hint, backend=backend)
    try:
        if target.endswith(".py"):
            path = Path(target).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            name = f"_df_user_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            sys.modules[name] = module
        else:
            module = importlib.import_module(target)
    except Exception as exc:
        raise BackendInitializationError(f"cannot load {option} {spec!r}: {exc}", hint=hint, backend=backend) from exc
    function = getattr(module, attr, None)
    if not callable(function):
        raise BackendInitializationError(f"{option} {spec!r}: {target} has no function {attr!r}", hint=hint,
                                         backend=backend)
    return function
