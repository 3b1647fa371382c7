"""The one CLI framework of the project: ``debug_validate``, ``session_report``, ``inductor-debug``
and every CLI to come are typer apps run through :func:`run_app`.

Exit codes, everywhere::

    EXIT_PASS     0  the command did what was asked; the validation passed
    EXIT_FAIL     1  a numerical failure (a checkpoint out of tolerance, a failing KernelDiff ...)
    EXIT_USAGE    2  a usage or environment error: a bad option (typer/click), a DF-coded
                     DebugFrameworkError, a CliError, an OSError/MemoryError
    EXIT_INTERNAL 3  an internal error, a bug of ours: one line on stderr that says so and names the
                     file holding the full traceback (never a traceback a CI reads as exit 1)
    EXIT_INTERRUPTED 130  Ctrl-C: one line on stderr (naming the session it marked as interrupted)

The crash log goes to ``$PIE_DEBUG_LOG_DIR`` if set, else to ``logs/`` beside the session database
(``--database``, ``PIE_DEBUG_DATABASE``, or ``~/.pie/debug/debug_framework.db``), else to
``<tempdir>/pie-debug-logs``. With ``--json`` a failure is also one JSON document on stdout
(:meth:`Invocation.error_document`).

Output helpers: :func:`make_console`, :func:`literal` and :func:`markup` (user text is never read as
rich markup), :func:`add_row`, :func:`print_json` (strict JSON, the project's one encoding rule) and
:func:`stage_progress` (progress on stderr). Importing this module does not import torch.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import platform
import re
import signal
import sys
import math
import threading
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
import contextlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
import typer.core
import typer.main

from ..errors import DebugFrameworkError
from ..jsonio import JsonValue, dumps_json
from ..termtext import terminal_safe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table
    from rich.text import Text

__all__ = [
    "EXIT_PASS", "EXIT_FAIL", "EXIT_USAGE", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "LOG_DIR_VARIABLE", "EXIT_CODES_HELP",
    "plain_help",
    "CliError", "Failure", "Invocation", "JsonValue", "ProgressCallback",
    "make_app", "run_app", "guarded", "failure_of", "raised_in", "crash_log_dir", "write_crash_log",
    "make_console", "literal", "markup", "add_row", "dumps_json", "print_json", "stage_progress",
    "StageProgress", "LONG_RUN_S",
    "stdout_for_json_only",
]

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
#: Ctrl-C (SIGINT), as shells report it (128 + 2).
EXIT_INTERRUPTED = 130
#: Environment variable naming the directory of crash logs (internal errors, exit 3).
LOG_DIR_VARIABLE = "PIE_DEBUG_LOG_DIR"

FailureKind = Literal["usage", "environment", "internal"]
#: ``(stage, done, total)``: what the engine's ``progress=`` callback receives.
ProgressCallback = Callable[[str, int, int], None]

_MESSAGE_LIMIT = 400


class CliError(Exception):
    """A usage or environment error found by a CLI itself, without a DF code (exit 2).

    Args:
        message: what is wrong, in one sentence.
        hint: what the user can do about it.
        kind: ``"usage"`` (the command line) or ``"environment"`` (files, imports, the machine).
    """

    def __init__(self, message: str, hint: str | None = None, kind: Literal["usage", "environment"] = "usage") -> None:
        super().__init__(message)
        self.hint = hint
        self.kind = kind


def _one_line(text: str, limit: int | None = None) -> str:
    """``text`` on one line (whitespace runs collapsed, control and bidi characters escaped by
    :func:`~debug_framework.termtext.terminal_safe`), cut to ``limit`` characters if given."""
    flat = terminal_safe(" ".join(str(text).split()))
    return flat if limit is None or len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class Failure:
    """What went wrong, as a CLI reports it: the exit code, one stderr line, one JSON object."""

    exit_code: int
    kind: FailureKind
    message: str
    hint: str | None = None
    code: str | None = None  # the DF code of a DebugFrameworkError
    title: str = ""  # and its title ("Database failure" ...)
    error: str = ""  # the exception's class name
    context: dict[str, str] = field(default_factory=dict)
    log_file: Path | None = None

    @classmethod
    def from_framework_error(cls, exc: DebugFrameworkError) -> Failure:
        d = exc.to_dict()
        return cls(EXIT_USAGE, "environment", exc.message, exc.hint or None, code=exc.code, title=exc.title,
                   error=d["error"], context=d["context"])

    def line(self, prog: str) -> str:
        """The one stderr line: DF errors as they render themselves, the rest with their hint."""
        if self.kind == "internal":
            where = (f"the traceback is in {self.log_file}" if self.log_file is not None
                     else "the traceback could not be written to a log file (it follows)")
            return (f"{prog}: internal error (a bug in {prog}, not a numerical failure): {self.message}; "
                    f"{where}; please report it")
        if self.code is not None:
            where = ", ".join(f"{k}={v}" for k, v in self.context.items())
            text = f"[{self.code}] {self.title}: {self.message}" + (f" ({where})" if where else "")
        else:
            text = f"error: {self.message}"
        return _one_line(f"{prog}: {text}" + (f". What to do: {self.hint}" if self.hint else ""))

    def to_dict(self) -> dict[str, object]:
        """JSON form; a DF error keeps ``DebugFrameworkError.to_dict``'s keys (``code`` is the DF code)."""
        return {"code": self.code or self.kind, "kind": self.kind, "error": self.error, "message": self.message,
                "hint": self.hint, "context": dict(self.context),
                "log_file": None if self.log_file is None else str(self.log_file)}


class Invocation:
    """One run of a CLI: its name, whether ``--json`` is on, and how its failures look.

    The app receives it as ``ctx.obj``; commands set :attr:`as_json` (and :attr:`database` when they
    know it) before doing work. Subclass it for another JSON envelope (:meth:`error_document`) or
    another rule for what is the environment's fault (:meth:`is_environment_error`).
    """

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.as_json = False
        self.database: Path | None = None  # the crash log goes to logs/ beside it
        self.argv: list[str] = []
        self.session_id: str | None = None  # the session a command works on: named when it is interrupted

    def interrupted_line(self) -> str:
        """The one stderr line of a Ctrl-C (exit 130)."""
        where = "" if self.session_id is None else f"; session {self.session_id} is marked error (interrupted by the user)"
        return f"{self.prog}: interrupted by the user (Ctrl-C){where}"

    def error_document(self, failure: Failure) -> JsonValue:
        """The JSON document printed on stdout for a failure under ``--json``."""
        return {"status": "error", "exit_code": failure.exit_code, "error": failure.to_dict()}

    def is_environment_error(self, exc: BaseException) -> bool:
        """True when ``exc`` (not a DF error nor a CliError) is the machine's fault, not a bug of ours."""
        return isinstance(exc, OSError | MemoryError)


#: The exit codes of every console script, as each one's ``--help`` ends and the README lists them.
EXIT_CODES_HELP = (
    "Exit codes (every command of this project): 0 done, and what was checked passed; "
    "1 a numerical failure: what was checked is out of its bound (a checkpoint, a batch item, a "
    "kernel sample, a KernelDiff, a tour step's check, or a --diff that got worse); "
    "2 a usage or environment error (a bad option or path, a DF-coded error); "
    "3 an internal error, a bug (the message names the crash log); 130 interrupted (Ctrl-C).")


def make_app(help: str, *, group: bool = False, epilog: str | None = None) -> typer.Typer:
    """A typer app with the project's settings: no shell-completion options, no pretty tracebacks,
    plain help (help text is never read as rich markup), ``-h`` as well as ``--help``, and the
    help ending with :data:`EXIT_CODES_HELP` (after ``epilog``; see :func:`plain_help`)."""
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                       no_args_is_help=group, help=help, epilog=epilog,
                       context_settings={"help_option_names": ["-h", "--help"]})


#: The one spelling of each option meaning across the commands, and the other spellings still read
#: (hidden: help shows the one): an alias becomes the first of its candidates the command has.
OPTION_ALIASES: dict[str, tuple[str, ...]] = {
    "--output": ("--output-file", "--output-dir"),  # inductor-debug report/minify, debug-tour, the demo
    "--output-path": ("--output-file",),  # plugin_compile, as the spec spells it
    "--format": ("--output-format",),  # inductor-debug report
    "--backend-file": ("--compile-backend-file",),  # debug_opsweep: a torch.compile backend, not a registration
}

#: The line every command's help ends with after the exit codes.
VERSION_HELP = "--version prints the version and exits."


def canonical_args(command: Any, args: Sequence[str]) -> list[str]:
    """``args`` with every hidden spelling of :data:`OPTION_ALIASES` replaced by the one the command
    (or the subcommand named before it) defines; a command that defines the alias itself keeps it.
    Nothing after ``--`` is touched."""
    out: list[str] = []
    current = command
    for n, token in enumerate(args):
        if token == "--":
            return out + list(args[n:])
        subcommands = getattr(current, "commands", None)
        if subcommands and token in subcommands:
            current = subcommands[token]
            out.append(token)
            continue
        name, eq, value = token.partition("=")
        if name in OPTION_ALIASES:
            defined = {o for p in current.params for o in (*p.opts, *p.secondary_opts)}
            if name not in defined:
                found = next((c for c in OPTION_ALIASES[name] if c in defined), None)
                token = token if found is None else found + eq + value
        out.append(token)
    return out


def package_version() -> str:
    """The installed package's version (the source tree's where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("multi-backend-debug-framework")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


#: A hyphen inside a word while help is wrapped: the wrapper breaks lines at spaces only, so an
#: option or identifier (``--output-format``, ``post_mlp:0``) is never split across two lines.
_GLUED_HYPHEN = "\u2011"
_WORD_HYPHEN = re.compile(r"(?<=\S)-|-(?=\S)")


def _glued(text: str) -> str:
    """``text`` with every hyphen that touches a word glued (wrapped as a letter)."""
    return _WORD_HYPHEN.sub(_GLUED_HYPHEN, text)


class HelpFormatter(typer.Context.formatter_class):  # click's formatter, as typer ships it
    """click's help formatter, except that lines break at spaces only: an option name, a file name
    or a checkpoint id in a help text is never split across two lines at any terminal width."""

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        """The options' definition list, each help text wrapped at spaces only."""
        super().write_dl([(term, _glued(text)) for term, text in rows], col_max, col_spacing)

    def write_text(self, text: str) -> None:
        """A paragraph (a command's help, the epilog), wrapped at spaces only."""
        super().write_text(_glued(text))

    def getvalue(self) -> str:
        """The formatted help, hyphens restored."""
        return super().getvalue().replace(_GLUED_HYPHEN, "-")


class HelpContext(typer.Context):
    """The context of every command: its help is written by :class:`HelpFormatter`."""

    formatter_class = HelpFormatter


def _default_text(value: object) -> str | None:
    """An option's default as its help states it (``float64``, ``a, b``), or None when there is
    nothing to state (no default, an empty one, a computed one)."""
    import enum

    if value is None or callable(value) or value == "" or value == () or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v.value if isinstance(v, enum.Enum) else v) for v in value)
    return str(value.value if isinstance(value, enum.Enum) else value)


def _state_default(param: typer.core.TyperOption) -> None:
    """One default style: the option's help ends with ``(default: X)`` (written in its help, or
    added here from its value), never click's ``[default: X]`` beside it."""
    param.show_default = False
    help_text = param.help or ""
    if "default" in help_text.lower():
        return
    if param.is_flag:  # an on/off pair states the side it takes; a lone flag is off unless given
        pair = param.secondary_opts and isinstance(param.default, bool)
        shown = (param.opts if param.default else param.secondary_opts)[-1].lstrip("-") if pair else None
    else:
        shown = _default_text(param.default)
    if shown is not None:
        param.help = f"{help_text} (default: {shown})" if help_text else f"(default: {shown})"


def plain_help(command: Any) -> Any:
    """``command`` (and its subcommands) with help that says each thing once, in words: every
    option's default is stated once as ``(default: X)`` (never click's ``[default: X]`` too), a
    value's placeholder is its name (``--model-path MODEL_PATH``), never a Python type (``<str>``,
    ``<int range>``, ``<list[str]>``); choices stay ``[a|b]``; lines break at spaces only
    (:class:`HelpFormatter`). Every command's help ends with :data:`EXIT_CODES_HELP`."""
    if EXIT_CODES_HELP not in (command.epilog or ""):
        ending = f"{EXIT_CODES_HELP} {VERSION_HELP}"
        command.epilog = f"{command.epilog}\n\n{ending}" if command.epilog else ending
    command.context_class = HelpContext
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)
    for param in command.params:  # typer's own parameter classes (it vendors click): duck-typed
        if getattr(param, "param_type_name", None) == "option":
            if not getattr(param, "count", False):
                _state_default(param)
        elif getattr(param, "param_type_name", None) == "argument":
            param.display_type_rich = lambda ctx: None  # its name says what it is
        descriptor = getattr(param, "type_descriptor", None)
        if param.metavar is None and not getattr(descriptor, "is_choice", False) and param.name:
            param.metavar = param.name.upper()
    return command


def run_app(app: typer.Typer, invocation: Invocation, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` (default ``sys.argv[1:]``) and return its exit code; nothing escapes.

    A command returns its exit code (``None`` is 0) or raises ``typer.Exit``; usage errors print
    click's short usage message and return 2; any other exception is mapped by :func:`guarded`.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    invocation.argv = args
    if args[:1] == ["--version"]:
        print(f"{invocation.prog} {package_version()}")
        return EXIT_PASS

    def body() -> int:
        try:
            command = plain_help(typer.main.get_command(app))
            args[:] = canonical_args(command, args)
            with _noting_interrupts() as interrupted:
                rv = command(args=args, prog_name=invocation.prog, standalone_mode=False, obj=invocation)
            if interrupted:  # typer turns Ctrl-C into a silent exit code 130
                raise KeyboardInterrupt
        except typer.Abort:
            print(f"{invocation.prog}: aborted", file=sys.stderr)
            return 130
        except typer.TyperException as exc:  # click's usage errors: its short usage message, exit 2
            show = getattr(exc, "show", None)
            if callable(show):  # click echoes the user's values: shown terminal-safe
                buffer = io.StringIO()
                show(file=buffer)
                sys.stderr.write(terminal_safe(buffer.getvalue(), multiline=True))
            else:
                print(terminal_safe(f"{invocation.prog}: error: {exc.format_message()}"), file=sys.stderr)
            return EXIT_USAGE  # never click's 1 (a FileError...), which would read as a numerical failure
        return EXIT_PASS if rv is None else int(rv)

    return guarded(invocation, body)


@contextmanager
def _noting_interrupts() -> Iterator[list[bool]]:
    """Yields a list that becomes ``[True]`` when SIGINT arrives inside the block (the interrupt
    itself still raises KeyboardInterrupt as usual). Only where Python's own handler is installed,
    on the main thread; elsewhere the list stays empty."""
    hit: list[bool] = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield hit
        return

    def note(signum: int, frame: object) -> None:
        hit.append(True)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def guarded(invocation: Invocation, body: Callable[[], int]) -> int:
    """``body()``'s exit code; an exception becomes a :class:`Failure` reported on stderr (and as
    JSON on stdout under ``--json``), returning 2 for usage/environment errors and 3 for bugs."""
    try:
        return body()
    except KeyboardInterrupt:
        print(terminal_safe(invocation.interrupted_line()), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place every CLI error is mapped to an exit code
        failure = failure_of(exc, invocation)
        if invocation.as_json:
            print_json(invocation.error_document(failure))
        print(terminal_safe(failure.line(invocation.prog)), file=sys.stderr)
        if failure.kind == "internal" and failure.log_file is None:
            sys.stderr.write(terminal_safe("".join(traceback.format_exception(exc)),  # last resort: no log
                                           multiline=True))
        return failure.exit_code


def failure_of(exc: BaseException, invocation: Invocation) -> Failure:
    """Classify ``exc``; an internal error gets its traceback written by :func:`write_crash_log`."""
    if isinstance(exc, DebugFrameworkError):
        return Failure.from_framework_error(exc)
    if isinstance(exc, CliError):
        return Failure(EXIT_USAGE, exc.kind, _one_line(str(exc)), exc.hint, error=type(exc).__name__)
    if invocation.is_environment_error(exc):
        return Failure(EXIT_USAGE, "environment", _one_line(f"{type(exc).__name__}: {exc}"), error=type(exc).__name__)
    log = write_crash_log(invocation, exc)
    return Failure(EXIT_INTERNAL, "internal", _one_line(f"{type(exc).__name__}: {exc}", _MESSAGE_LIMIT),
                   hint="this is a bug; report it with the log file", error=type(exc).__name__,
                   context={} if log is None else {"log_file": str(log)}, log_file=log)


def raised_in(exc: BaseException, files: set[str]) -> bool:
    """True when the traceback of ``exc``, or of an exception in its cause/context chain, passes
    through one of ``files``: how a CLI that runs user code tells the user's errors from its own."""
    seen: set[int] = set()
    chain: BaseException | None = exc
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        tb = chain.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename in files:
                return True
            tb = tb.tb_next
        chain = chain.__cause__ or chain.__context__
    return False


def crash_log_dir(database: Path | None = None) -> Path:
    """Where crash logs go: ``$PIE_DEBUG_LOG_DIR``, else ``logs/`` beside ``database`` (default: the
    configured session database), else ``<tempdir>/pie-debug-logs``."""
    configured = os.environ.get(LOG_DIR_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    if database is None:
        from ..config import default_database_path, from_environment, merge_config

        try:
            database = default_database_path(merge_config(from_environment()))
        except DebugFrameworkError:  # a bad PIE_DEBUG_* value must not hide the crash
            return Path(tempfile.gettempdir()) / "pie-debug-logs"
    if not isinstance(database, Path):  # a postgresql:// URL: no folder beside it
        return Path(tempfile.gettempdir()) / "pie-debug-logs"
    return database.expanduser().parent / "logs"


_URL_PASSWORD = re.compile(r"(://[^/@:\s]*):[^@/\s]*@")
_QUERY_PASSWORD = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def redact_secrets(text: str) -> str:
    """``text`` with the password of any URL in it (``scheme://user:password@host``, or a
    ``password=`` parameter) replaced by ``***``: what a crash log may keep of a command line."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))


def write_crash_log(invocation: Invocation, exc: BaseException) -> Path | None:
    """Write the traceback of ``exc`` (with the command line and versions) to a new file under
    :func:`crash_log_dir`, falling back to the temp dir; ``None`` when neither is writable."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    name = f"{Path(invocation.prog).name.replace(' ', '_')}-{stamp}-{os.getpid()}.log"
    text = "".join([
        f"{invocation.prog}: internal error at {stamp} UTC\n",
        f"argv: {json.dumps([redact_secrets(a) for a in invocation.argv])}\ncwd: {os.getcwd()}\n",
        f"python: {sys.version.split()[0]} ({platform.platform()})\n\n",
        *(redact_secrets(line) for line in traceback.format_exception(exc)),
    ])
    for folder in (crash_log_dir(invocation.database), Path(tempfile.gettempdir()) / "pie-debug-logs"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(text, encoding="utf-8")
            return path.resolve()
        except OSError:
            continue
    return None


# ---------------------------------------------------------------------------------------------- output


def make_console(*, stderr: bool = False, piped_width: int = 120) -> Console:
    """A rich console; piped output (CI logs, files) gets ``piped_width`` columns rather than 80 unless
    ``COLUMNS`` says otherwise. Emoji codes are off, so ``:name:`` in user text stays as written."""
    from rich.console import Console

    console = Console(stderr=stderr, emoji=False)
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(stderr=stderr, emoji=False, width=piped_width)


def literal(value: object) -> Text:
    """``value`` as rich text shown as written (no markup, no emoji), its control and bidi characters
    escaped (:func:`~debug_framework.termtext.terminal_safe`; newlines and tabs kept): for user text in tables."""
    from rich.text import Text

    return Text(terminal_safe(value, multiline=True))


def markup(template: str, *values: object) -> str:
    """``template.format(*values)`` with every value escaped: the template's markup is styled,
    the values (paths, names, session ids ...) print literally, their control and bidi characters
    shown escaped (:func:`~debug_framework.termtext.terminal_safe`)."""
    from rich.markup import escape

    return template.format(*(escape(terminal_safe(v, multiline=True)) for v in values))


def add_row(table: Table, *cells: object, style: str | None = None) -> None:
    """Add a row whose cells are literal text (strings are never read as markup)."""
    from rich.text import Text

    table.add_row(*(c if isinstance(c, Text) else literal(c) for c in cells), style=style)


@contextmanager
def stdout_for_json_only(enabled: bool = True) -> Iterator[None]:
    """While the block runs, everything written to standard output (by Python code, C code, Ray's
    driver threads, child processes started meanwhile) goes to standard error instead: under
    ``--json`` stdout carries only the one JSON document printed after the block."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved_fd: int | None = None
    try:
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptors to move (an embedded interpreter): Python's level only
        saved_fd = None
    saved_stream = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        sys.stdout = saved_stream
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def print_json(value: object) -> None:
    """One strict JSON document on stdout."""
    sys.stdout.write(dumps_json(value) + "\n")
    sys.stdout.flush()


#: A run is long after this many seconds: from then on, progress is printed as lines on a stderr
#: that is not a terminal (a log, CI), at most one per :data:`LINE_EVERY_S` per stage.
LONG_RUN_S = 30.0
LINE_EVERY_S = 10.0


#: what a stage's inner progress counts where it is not layers: the decode stage counts its steps
_UNITS = {"decode": "step"}


class StageProgress:
    """What :func:`stage_progress` yields: called as ``(stage, done, total)`` when a stage finishes
    (the engine's ``progress=``), and :meth:`layers` as a stage gets through the model's layers
    (its ``layer_progress=``). On a terminal, a transient bar per stage and one per layer; on any
    other stderr nothing until the run is long (:data:`LONG_RUN_S`), then plain lines."""

    def __init__(self, console: Console, bar: Progress, task: TaskID, clock: Callable[[], float]) -> None:
        self.console, self.bar, self.task, self.clock = console, bar, task, clock
        self.started = clock()
        self.layer_task = bar.add_task("", total=None, visible=False)
        self._last_line: dict[str, float] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        from rich.markup import escape

        self.bar.update(self.layer_task, visible=False)
        self.bar.update(self.task, completed=done, total=total, description=escape(terminal_safe(f"{stage} done")))
        self._line(f"{stage} done ({done}/{total} stages)", stage, final=True)

    def layers(self, stage: str, done: int, total: int) -> None:
        """Layer ``done`` of ``total`` of ``stage`` finished (a forward pass, or isolation's replays)."""
        from rich.markup import escape

        unit = _UNITS.get(stage, "layer")
        self.bar.update(self.layer_task, visible=True, completed=done, total=total,
                        description=escape(terminal_safe(f"  {stage}: {unit}")))
        self._line(f"{stage}: {unit} {done}/{total}", stage, final=done >= total)

    def _line(self, text: str, stage: str, *, final: bool) -> None:
        """One plain line on a stderr that is not a terminal, once the run is long."""
        if self.console.is_terminal:
            return
        now = self.clock()
        if now - self.started < LONG_RUN_S:
            return
        if not final and now - self._last_line.get(stage, -math.inf) < LINE_EVERY_S:
            return
        self._last_line[stage] = now
        self.console.print(f"[{now - self.started:6.1f} s] {terminal_safe(text)}", markup=False, highlight=False,
                           soft_wrap=True)


@contextmanager
def stage_progress(console: Console, description: str, *,
                   clock: Callable[[], float] = time.monotonic) -> Iterator[StageProgress]:
    """Progress on ``console`` (meant for stderr): a transient bar on a terminal, plain lines on
    anything else once the run is long (:class:`StageProgress`); stdout is never written."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
        yield StageProgress(console, bar, bar.add_task(escape(terminal_safe(description)), total=None), clock)
