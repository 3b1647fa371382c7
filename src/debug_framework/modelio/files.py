"""Guarded reads of a model's files: only regular files are opened, JSON is bounded in size and depth.

A FIFO, socket or device named like a weights or config file would block or never end; a JSON
file nested 100,000 deep or holding a 5,000-digit number would raise ``RecursionError`` or
``ValueError`` deep inside ``json``. Every such file is a ``ModelLoadingError`` (DF004) naming it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ..errors import ModelLoadingError
from ..jsonio import JsonValue
from ..safefiles import path_exists

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "model_path_exists", "regular_file_size", "read_head", "read_json", "short_repr"]

#: The largest ``config.json`` / shard index read (real ones are kilobytes; a 100k-tensor index ~10 MB).
MAX_JSON_BYTES = 64 << 20
#: The deepest nesting accepted in a JSON file (real configs nest 3 or 4 levels).
MAX_JSON_DEPTH = 32

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory"}


def _not_regular(path: Path, mode: int) -> ModelLoadingError:
    kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
    return ModelLoadingError(f"not a regular file: the path is {kind}", file=str(path),
                             hint="point at the model's real files (a FIFO or device would block or never end)")


def model_path_exists(path: Path) -> bool:
    """Whether the model path exists; a path the OS refuses to look at (a name over the length
    limit, a NUL byte, no permission on a parent) is DF004 saying why, not an ``OSError``."""
    return path_exists(path, error=ModelLoadingError, hint="pass a shorter, existing model path")


def regular_file_size(path: Path) -> int:
    """The size of ``path`` after checking (without opening it) that it is a regular file; DF004 otherwise."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelLoadingError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from exc
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    return st.st_size


def _open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file ``path`` (opened non-blocking, checked with fstat)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelLoadingError(
            f"cannot read the file: {exc.strerror or exc}", file=str(path),
            hint="check that the file exists and is readable by this user",
        ) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    return fd


def read_head(path: Path, n: int) -> bytes:
    """At most the first ``n`` bytes of the regular file ``path``."""
    fd = _open_regular(path)
    try:
        with os.fdopen(fd, "rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise ModelLoadingError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from exc


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a config value may be a megabyte string)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether lists/objects nest deeper than ``limit`` (iterative: no recursion on hostile input)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def read_json(path: Path, what: str) -> JsonValue:
    """The JSON value in the regular file ``path`` (called ``what`` in messages), bounded in size and depth.

    Raises:
        ModelLoadingError: (DF004) not a regular file, unreadable, larger than :data:`MAX_JSON_BYTES`,
            not UTF-8 JSON, nested deeper than :data:`MAX_JSON_DEPTH`, or a number Python refuses to read.
    """
    fd = _open_regular(path)
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise ModelLoadingError(f"{what} cannot be read: {exc.strerror or exc}", file=str(path)) from exc
    if len(raw) > MAX_JSON_BYTES:
        raise ModelLoadingError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB", file=str(path))
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError as exc:
        raise ModelLoadingError(f"{what} is nested too deeply to read", file=str(path)) from exc
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, and ints past sys.get_int_max_str_digits()
        raise ModelLoadingError(f"{what} is not valid JSON: {str(exc)[:200]}", file=str(path)) from exc
    if _depth_exceeds(data, MAX_JSON_DEPTH):
        raise ModelLoadingError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels", file=str(path))
    return data
