"""The one repro format: the layout, the verdict line and the exit codes of every repro the project
writes, and the one function that verifies a repro in a fresh process.

Six writers use it: the drill-down's operator repro (``services.drilldown.repro``), the drill-down's
ONNX node repro of an ONNX-graph engine (``backends/<engine>/repro.py``), the drill-down's ggml node
repro of llama.cpp (``services.drilldown.ggml_repro``), the op sweep's kernel repro (``plugins.repro``),
the minifier's graph repro (``debug_module.minifier.codegen``) and the conformance sweep's operator
repro (``conformance.repro``). Each supplies only its data files,
its writer-specific manifest entries and the body of its check; this module writes the rest.

Layout of a repro directory::

    repro.py            the check: ``python repro.py`` from any working directory
    repro.json          the manifest (:data:`FORMAT`, the writer, the failure, what it needs, the
                        versions it was written with, its files, and the writer's ``check`` entries)
    inputs.safetensors  the data (or ``.npy`` / ``.onnx`` files); never pickle
    <sources>           copies of what the check loads (a backend file, a plugin build, a graph transform)
    verify.log          stdout and stderr of the verifying run (written by :func:`verify`)

Contract of ``repro.py``: it resolves every path against its own file, needs only the packages the
manifest's ``requires`` lists (torch and safetensors, or numpy and an ONNX runtime; never this project),
prints one JSON observation line (:data:`OBSERVATION_PREFIX`) and, last, one verdict line:

    ``REPRO: reproduced: <detail>``  exit 1: the failure is there
    ``REPRO: fixed: <detail>``       exit 0: the failure is gone
    ``REPRO: error: <detail>``       exit 2: the check cannot run here (a missing package, an
                                     unreadable file)

A repro is *verified* only when a fresh process printed ``REPRO: reproduced`` last and exited 1: a
crash (a traceback also exits 1) never counts.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .jsonio import JsonObject

__all__ = ["FORMAT", "SCRIPT", "MANIFEST", "INPUTS", "LOG", "WRITERS", "EXIT_CODES", "VERDICT_PREFIX",
           "OBSERVATION_PREFIX", "REPRO_TIMEOUT_S", "VerifyResult", "write_repro_files", "script_source",
           "docstring_text", "verdict_line", "parse_output", "verify", "read_manifest", "is_installed",
           "SAFETENSORS_READER", "OPTIONAL_PACKAGES"]

#: The manifest's ``format`` value.
FORMAT = "debug_framework.repro/1"
SCRIPT, MANIFEST, INPUTS, LOG = "repro.py", "repro.json", "inputs.safetensors", "verify.log"
#: The writers, as the manifest's ``writer`` names them.
WRITERS = ("drilldown-replay", "drilldown-onnx", "drilldown-ggml", "plugin-sweep", "minifier", "op-conformance")
Verdict = Literal["reproduced", "fixed", "error"]
#: Exit code of ``repro.py`` per verdict.
EXIT_CODES: dict[str, int] = {"fixed": 0, "reproduced": 1, "error": 2}
VERDICT_PREFIX = "REPRO: "
OBSERVATION_PREFIX = "REPRO-OBSERVATION: "
#: How long one verifying run of a repro may take, in seconds.
REPRO_TIMEOUT_S = 300.0

#: Source of ``load_file(path)`` for a generated repro.py (needs ``json``, ``sys`` and ``torch``
#: imported, and ``CannotCheck`` defined, as the shared head of every repro.py has them): the tensors
#: of a safetensors file read with torch alone, so a repro of torch tensors needs no other package.
#: The layout is safetensors' own: an 8-byte little-endian header length, a JSON header (per
#: tensor its ``dtype``, ``shape`` and ``data_offsets`` into the bytes after the header), the raw
#: little-endian bytes. Each tensor is a fresh, writable, aligned copy.
SAFETENSORS_READER = '''
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
                      "U64": "uint64", "BOOL": "bool", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
                      "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz",
                      "F8_E8M0": "float8_e8m0fnu"}


def load_file(path):
    """The tensors of a safetensors file, read with torch alone (no safetensors package needed)."""
    if sys.byteorder != "little":
        raise CannotCheck("the stored tensors are little-endian; this machine is not")
    with open(path, "rb") as f:
        data = bytearray(f.read())  # writable: torch.frombuffer shares it without a warning
    if len(data) < 8:
        raise CannotCheck("%s is not a safetensors file (%d bytes)" % (os.path.basename(path), len(data)))
    size = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8:8 + size]).decode("utf-8"))
    start = 8 + size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = getattr(torch, SAFETENSORS_DTYPES.get(info["dtype"], "?"), None)
        if not isinstance(dtype, torch.dtype):
            raise CannotCheck("tensor %s has dtype %s, which this torch cannot hold" % (name, info["dtype"]))
        begin, end = info["data_offsets"]
        out = torch.empty(info["shape"], dtype=dtype)
        if end > begin:  # copied into the fresh tensor's storage byte for byte (any dtype, any alignment)
            raw = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=start + begin)
            out.reshape(-1).view(torch.uint8).copy_(raw)
        tensors[name] = out
    return tensors
'''

_VERDICT = re.compile(r"^REPRO: (reproduced|fixed|error): ?(.*)$")

# In the fresh process: make this project (and the packages in {blocked}) unimportable, then run the
# script as __main__.
_BOOT = ("import runpy, sys\n"
         "for _m in ('debug_module', 'debug_framework'{blocked}):\n"
         "    sys.modules[_m] = None\n"
         "sys.argv = sys.argv[1:]\n"
         "runpy.run_path(sys.argv[0], run_name='__main__')\n")

# The top of every repro.py, after its docstring. {imports} are the writer's, guarded: a missing
# package is a broken environment (exit 2), not a reproduction.
_HEAD = '''import json
import os
import sys
import traceback

sys.dont_write_bytecode = True  # leave the repro directory as it is
HERE = os.path.dirname(os.path.abspath(__file__))  # every file is found beside this script


class CannotCheck(Exception):
    """The check cannot run here (exit 2)."""


def manifest():
    """repro.json: the failure and the writer's ``check`` entries."""
    with open(os.path.join(HERE, "repro.json"), encoding="utf-8") as f:
        return json.load(f)


try:
{imports}
except ImportError as _missing:
    print("REPRO: error: a package the check needs is missing: %s" % (_missing,))
    sys.exit(2)
'''

# The end of every repro.py: the writer's check() returns (reproduced, detail, observation).
_FOOT = '''

def _one_line(text):
    return " ".join(str(text).split())


def _main():
    try:
        reproduced, detail, observation = check()
    except CannotCheck as exc:
        print("REPRO: error: " + _one_line(exc))
        return 2
    except Exception as exc:  # the check could not run: unreadable files, an environment that differs
        traceback.print_exc()
        print("REPRO: error: the check could not run: %s: %s" % (type(exc).__name__, _one_line(exc)[:500]))
        return 2
    print("REPRO-OBSERVATION: " + json.dumps(observation, default=str))
    print(("REPRO: reproduced: " if reproduced else "REPRO: fixed: ") + _one_line(detail))
    return 1 if reproduced else 0


if __name__ == "__main__":
    sys.exit(_main())
'''


def docstring_text(text: str) -> str:
    """``text`` (user text: an operator, a node name, a message) on one line and escaped, safe inside
    a generated file's triple-quoted docstring (it reads back as the original, line breaks aside)."""
    return " ".join(text.split()).replace("\\", "\\\\").replace('"', '\\"')


def verdict_line(verdict: Verdict, detail: str) -> str:
    """The line a repro prints last (what its exit code says)."""
    return f"{VERDICT_PREFIX}{verdict}: {' '.join(detail.split())}"


def script_source(*, writer: str, failure: str, body: str, imports: Sequence[str], requires: Sequence[str],
                  title: str = "") -> str:
    """The text of ``repro.py``: docstring, guarded imports, the writer's ``body`` (which must define
    ``check() -> (reproduced, detail, observation)``) and the contract's ``_main``."""
    if writer not in WRITERS:
        raise ValueError(f"unknown repro writer {writer!r}")
    head = f"{docstring_text(title)}\n\n" if title else ""
    doc = (f'"""{head}Standalone repro written by debug_framework ({writer}, format {FORMAT}).\n\n'
           f"Failure: {docstring_text(failure)}\n"
           f"Run: python repro.py   (from any directory; needs {', '.join(requires)}; never this project)\n"
           f"Prints REPRO: reproduced (exit 1) while the failure is there, REPRO: fixed (exit 0) once it is\n"
           f"gone, REPRO: error (exit 2) when the check cannot run here.\n"
           f'"""\n')
    guarded = "\n".join(f"    {line}" for line in imports) or "    pass"
    return ("#!/usr/bin/env python3\n" + doc + _HEAD.format(imports=guarded) + "\n\n" + body.strip("\n") + "\n"
            + _FOOT)


def _versions(requires: Sequence[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for name in requires:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_repro_files(folder: str | os.PathLike[str], *, writer: str, failure: str, body: str, imports: Sequence[str],
                requires: Sequence[str], check: JsonObject, environment: JsonObject | None = None,
                title: str = "") -> Path:
    """Write ``repro.py`` and ``repro.json`` into ``folder`` (the writer has put its data files there
    first: the manifest lists them); the path of ``repro.py``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / LOG).unlink(missing_ok=True)  # a log of an earlier repro in this folder says nothing of this one
    script = script_source(writer=writer, failure=failure, body=body, imports=imports, requires=requires, title=title)
    files = sorted({p.name for p in out.iterdir() if p.is_file()} | {SCRIPT, MANIFEST})
    manifest = {"format": FORMAT, "writer": writer, "failure": " ".join(failure.split()),
                "run": f"python {SCRIPT}", "exit_codes": {str(v): k for k, v in EXIT_CODES.items()},
                "requires": list(requires), "files": files,
                "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "environment": {**_versions(requires), **(environment or {})}, "check": check}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    (out / SCRIPT).write_text(script, encoding="utf-8")
    return out / SCRIPT


def is_installed(file: str | os.PathLike[str]) -> bool:
    """Whether ``file`` belongs to an installed package (site-packages or the standard library): a
    repro may import it by name; any other source it needs is copied beside ``repro.py``."""
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    return any(os.path.abspath(file).startswith(os.path.abspath(p) + os.sep) for p in paths)


def read_manifest(folder: str | os.PathLike[str]) -> JsonObject:
    """A repro directory's ``repro.json``."""
    return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))


@dataclass
class VerifyResult:
    """What a fresh process running ``repro.py`` showed. ``reproduced`` is the verification: the last
    line said ``REPRO: reproduced`` and the exit code was 1."""

    reproduced: bool
    returncode: int | None
    observation: JsonObject | None
    stdout: str = ""
    stderr: str = ""
    command: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: ``reproduced`` / ``fixed`` / ``error`` from the verdict line; ``None`` without one (a crash, a hang)
    verdict: str | None = None
    detail: str = ""

    def to_dict(self) -> JsonObject:
        return {"reproduced": self.reproduced, "verdict": self.verdict, "detail": self.detail,
                "returncode": self.returncode, "observation": self.observation,
                "stdout_tail": self.stdout[-2000:], "stderr_tail": self.stderr[-2000:], "command": self.command,
                "seconds": round(self.seconds, 3)}


def parse_output(stdout: str) -> tuple[str | None, str, JsonObject | None]:
    """(verdict, detail, observation) of a repro's stdout: the verdict from its last non-empty line
    (``None`` when that is no verdict line), the observation from the last observation line."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    found = _VERDICT.match(lines[-1].rstrip()) if lines else None
    observation = None
    for line in reversed(lines):
        if line.startswith(OBSERVATION_PREFIX):
            try:
                value = json.loads(line[len(OBSERVATION_PREFIX):])
            except json.JSONDecodeError:
                value = None
            observation = value if isinstance(value, dict) else None
            break
    return (found.group(1), found.group(2), observation) if found else (None, "", observation)


#: Packages a repro may read its files with that ``verify`` makes unimportable unless the manifest's
#: ``requires`` lists them: the writers read ``inputs.safetensors`` with torch alone
#: (:data:`SAFETENSORS_READER`), and verifying proves it.
OPTIONAL_PACKAGES = ("safetensors",)


def verify(repro: str | os.PathLike[str], *, timeout: float = REPRO_TIMEOUT_S, isolated: bool = True,
           python: str | None = None, log: bool = True) -> VerifyResult:
    """Run a repro (its directory or its ``repro.py``) once in a fresh interpreter and verify it.

    The interpreter starts without ``PYTHON*`` variables, in a new temporary working directory; with
    ``isolated`` (the default) also with ``-I`` (no user site) and this project's packages made
    unimportable, as for a user who has only the repro, and so are the :data:`OPTIONAL_PACKAGES` its
    manifest does not require (safetensors: a repro needs no more than it says). With ``log``, ``verify.log`` beside the
    script keeps the command, its exit code, its stdout and stderr.
    """
    script = Path(repro).resolve()
    if script.is_dir():
        script = script / SCRIPT
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    exe = python or sys.executable
    try:
        requires = read_manifest(script.parent).get("requires") or []
    except (OSError, ValueError, AttributeError):
        requires = []  # no manifest to go by: the script itself says what it needs
    blocked = "".join(f", {name!r}" for name in OPTIONAL_PACKAGES if name not in requires)
    cmd = [exe, "-I", "-c", _BOOT.format(blocked=blocked), str(script)] if isolated else [exe, str(script)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="df-repro-") as cwd:
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            result = VerifyResult(False, None, None, out, f"timed out after {timeout:g} s", cmd,
                                  time.perf_counter() - start)
        except OSError as exc:
            result = VerifyResult(False, None, None, "", f"cannot start {exe}: {exc}", cmd, time.perf_counter() - start)
        else:
            verdict, detail, observation = parse_output(proc.stdout)
            result = VerifyResult(proc.returncode == 1 and verdict == "reproduced", proc.returncode, observation,
                                  proc.stdout, proc.stderr, cmd, time.perf_counter() - start, verdict, detail)
    if log:
        try:
            (script.parent / LOG).write_text(f"$ python {script.name} (cwd elsewhere)\nexit {result.returncode}\n"
                                             f"{result.stdout}{result.stderr}", encoding="utf-8")
        except OSError:
            pass  # a read-only repro directory: the result itself says what happened
    return result
