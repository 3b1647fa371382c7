"""Guarded reading of the user's JSON files and guarded output paths (no heavy imports).

Reading (configuration files, plugin manifests): :func:`read_strict_json` opens only a regular file
(a FIFO or ``/dev/zero`` would block or never end), reads at most :data:`MAX_CONFIG_BYTES`, decodes
strict UTF-8, and parses strict JSON: no ``NaN``/``Infinity``, no number that overflows a float,
integers within :data:`MAX_JSON_INT` in magnitude, nesting at most :data:`MAX_JSON_DEPTH` deep.
Every violation is the caller's DF error class naming the file and the field (``tolerance.rtol``,
``kernels[0].args.eps``).

Writing (``--output-file`` of every CLI): :func:`check_output_path` refuses an existing path that is
a symlink or not a regular file (a FIFO, ``/dev/full``, a directory), so a write never replaces a
device or follows a link; ``-`` means stdout where the format allows it (:data:`STDOUT_PATH`).
The write itself goes through a temporary file and ``os.replace`` (``models._common.write_text_atomic``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigurationError, DebugFrameworkError

__all__ = ["MAX_CONFIG_BYTES", "MAX_JSON_DEPTH", "MAX_JSON_INT", "STDOUT_PATH", "read_strict_json",
           "check_output_path", "is_stdout", "file_kind", "field_path", "size_text", "path_exists"]

#: The largest configuration file or plugin manifest read (real ones are a few kilobytes).
MAX_CONFIG_BYTES = 1 << 20
#: The deepest nesting of lists/objects accepted (real files nest 3 or 4 levels).
MAX_JSON_DEPTH = 32
#: The largest integer magnitude accepted (a signed 64-bit integer).
MAX_JSON_INT = (1 << 63) - 1
#: The ``--output-file`` value that means standard output.
STDOUT_PATH = "-"

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}
# the longest integer literal worth converting (20 digits hold every 64-bit value)
_MAX_INT_DIGITS = 20


def size_text(n: int) -> str:
    """``1 MiB``, ``64 KiB``, ``100 bytes``: a byte count as messages say it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def file_kind(mode: int) -> str:
    """``"a FIFO"``, ``"a character device"`` ... for a ``st_mode`` that is not a regular file."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


class _Bad:
    """A value the strict parser refused, kept in the tree so the walk can name its field."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def _parse_constant(name: str) -> _Bad:
    return _Bad(f"{name} is not a finite number")


def _parse_int(text: str) -> int | _Bad:
    digits = text.lstrip("-")
    if len(digits) > _MAX_INT_DIGITS:
        return _Bad(f"an integer of {len(digits)} digits is out of range (at most {MAX_JSON_INT} in magnitude)")
    value = int(text)
    if abs(value) > MAX_JSON_INT:
        return _Bad(f"{text} is out of range (at most {MAX_JSON_INT} in magnitude)")
    return value


def _parse_float(text: str) -> float | _Bad:
    if len(text) > 400:
        return _Bad(f"a number of {len(text)} characters is out of range")
    value = float(text)
    if not math.isfinite(value):
        return _Bad(f"{text[:40]} overflows a float")
    return value


def field_path(parts: tuple[object, ...]) -> str:
    """``("kernels", 0, "args", "eps")`` -> ``kernels[0].args.eps`` (``<top level>`` for none)."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


def _check_tree(data: object, fail: Callable[[str, tuple[object, ...]], None]) -> None:
    """Walk ``data`` iteratively: a refused value or nesting past :data:`MAX_JSON_DEPTH` calls ``fail``."""
    stack: list[tuple[object, tuple[object, ...]]] = [(data, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, _Bad):
            fail(item.why, where)
        if len(where) > MAX_JSON_DEPTH:
            fail(f"nested deeper than {MAX_JSON_DEPTH} levels", where[:MAX_JSON_DEPTH])
        if isinstance(item, dict):
            stack.extend((v, (*where, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(item))


def read_strict_json(path: str | os.PathLike[str], what: str, *,
                     error: type[DebugFrameworkError] = ConfigurationError, hint: str | None = None,
                     max_bytes: int = MAX_CONFIG_BYTES) -> object:
    """The JSON value of the regular file ``path`` (``what`` names it in messages), read strictly.

    Raises:
        ``error`` (default ConfigurationError, DF005), naming the file and, for a bad value, the field:
            not a regular file, unreadable, larger than ``max_bytes``, not UTF-8, not JSON, a
            non-finite or out-of-range number, nesting deeper than :data:`MAX_JSON_DEPTH`.
    """
    p = Path(path)
    ctx: dict[str, str] = {"file": str(p)}
    if hint is not None:
        ctx["hint"] = hint
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot read the {what}: {exc.strerror or exc}", **ctx) from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"the {what} is {file_kind(mode)}, not a regular file", **ctx)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read the {what}: {exc.strerror or exc}", **ctx) from exc
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise error(f"the {what} is larger than {size_text(max_bytes)}, the most a {what} may have", **ctx)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"the {what} is not UTF-8 text (byte {exc.start} cannot be decoded)", **ctx) from exc
    if text.startswith("\ufeff"):
        text = text[1:]  # a UTF-8 byte-order mark, as some editors write
    try:
        data = json.loads(text, parse_constant=_parse_constant, parse_int=_parse_int, parse_float=_parse_float)
    except RecursionError as exc:
        raise error(f"the {what} is nested deeper than {MAX_JSON_DEPTH} levels", **ctx) from exc
    except ValueError as exc:  # JSONDecodeError
        raise error(f"the {what} is not JSON: {str(exc)[:200]}", **ctx) from exc

    def fail(why: str, where: tuple[object, ...]) -> None:
        raise error(f"the {what} has a bad value at {field_path(where)}: {why}", field=field_path(where), **ctx)

    _check_tree(data, fail)
    return data


def _os_refusal(exc: OSError) -> str:
    """What an ``OSError`` on a path means, in words (ENAMETOOLONG named plainly)."""
    if exc.errno == errno.ENAMETOOLONG:
        return "the path is longer than the file system allows"
    return f"cannot look at the path: {exc.strerror or exc}"


def _shown(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    return text if len(text) <= 300 else text[:300] + "..."


def path_exists(path: str | os.PathLike[str], *, error: type[DebugFrameworkError] = ConfigurationError,
                hint: str | None = None) -> bool:
    """Whether ``path`` exists (``os.stat``, links followed). A path the OS refuses to look at (a
    name over the length limit, a loop of links, no permission on a parent, a NUL byte) is ``error``
    saying why, never an ``OSError`` or ``ValueError`` that would read as a bug."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise error(_os_refusal(exc), file=_shown(path), hint=hint) from exc
    except ValueError as exc:  # an embedded NUL byte
        raise error("the path holds a NUL byte", file=repr(os.fspath(path))[:300], hint=hint) from exc
    return True


def is_stdout(path: str | os.PathLike[str] | None) -> bool:
    """Whether an ``--output-file`` value means standard output (``-``)."""
    return path is not None and os.fspath(path) == STDOUT_PATH


def check_output_path(path: str | os.PathLike[str], option: str = "--output-file") -> Path:
    """``path`` (``~`` expanded) after checking it may be written by replacing it: it does not exist
    or is a regular file. A symlink, FIFO, device, socket or directory is refused, and so is a path
    the OS refuses to look at (a name over the length limit).

    Raises:
        ConfigurationError (DF005): naming the path and what it is.
    """
    p = Path(path).expanduser()
    try:
        st = os.lstat(p)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return p  # missing, or a parent that is a file / not searchable: the write reports it
        raise ConfigurationError(f"cannot write {option}: {_os_refusal(exc)}", file=_shown(p),
                                 hint=f"choose a shorter path for {option}") from exc
    except ValueError as exc:  # an embedded NUL byte
        raise ConfigurationError(f"cannot write {option}: the path holds a NUL byte", file=repr(str(p))[:300],
                                 hint=f"choose another path for {option}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigurationError(
            f"{option} exists and is {file_kind(st.st_mode)}; only a regular file is replaced", file=str(p),
            hint=f"choose a new or regular file for {option}" + (" (or - for standard output)"
                                                                   if option == "--output-file" else ""))
    return p
