"""Compilers of the four plugin backend types: availability, flags per optimisation level, the
commands, and the compiler's first error read out of a build log.

=====  ==========================  =========================  ==========================  ==============
level  cpp (system C++ compiler)   cuda (nvcc)                metal (xcrun metal)         triton
=====  ==========================  =========================  ==========================  ==============
0      ``-O0 -g``                  ``-O0 -G`` (device debug)  ``-O0``                     (JIT at run time;
1      ``-O1``                     ``-O1 -Xptxas -O1``        ``-O1``                      the level is
2      ``-O2``                     ``-O2 -Xptxas -O2``        ``-O2``                      recorded only)
3      ``-O3``                     ``-O3 -Xptxas -O3``        ``-O3``
=====  ==========================  =========================  ==========================  ==============

C++ and CUDA libraries are built against the running torch (``torch.utils.cpp_extension``'s include
and library paths, its C++ ABI flag) and register their operators with ``TORCH_LIBRARY``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["OPT_FLAGS", "Toolchain", "toolchain", "first_error", "CompilerError"]

OPT_FLAGS: dict[str, dict[int, tuple[str, ...]]] = {
    "cpp": {0: ("-O0", "-g"), 1: ("-O1",), 2: ("-O2",), 3: ("-O3",)},
    "cuda": {0: ("-O0", "-G"), 1: ("-O1", "-Xptxas", "-O1"), 2: ("-O2", "-Xptxas", "-O2"), 3: ("-O3", "-Xptxas", "-O3")},
    "metal": {0: ("-O0",), 1: ("-O1",), 2: ("-O2",), 3: ("-O3",)},
    "triton": {0: (), 1: (), 2: (), 3: ()},
}

_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?:fatal\s+)?error:\s*(?P<msg>.+)$")
_NVCC = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*(?:catastrophic\s+)?error:\s*(?P<msg>.+)$")
_ANY = re.compile(r"\berror\b[:\s]", re.I)


class CompilerError(Exception):
    """A compile command that failed: its first error (``file:line: message``) and its full log."""

    def __init__(self, first: str, log: str) -> None:
        super().__init__(first)
        self.first = first
        self.log = log


def first_error(log: str) -> str:
    """The compiler's first error as ``file:line: message`` (else the first line mentioning an error)."""
    lines = log.splitlines()
    for line in lines:
        m = _GCC.match(line.strip()) or _NVCC.match(line.strip())
        if m:
            return f"{m['file']}:{m['line']}: {m['msg'].strip()}"
    for line in lines:
        if _ANY.search(line):
            return line.strip()
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "the compiler failed without output")


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (out.stdout or out.stderr).strip().splitlines()
    return " ".join(text[-1:] if "nvcc" in cmd[0] else text[:1]) or "unknown"


@dataclass(frozen=True)
class Toolchain:
    """One backend type's compiler on this machine."""

    backend_type: str
    compiler: str | None  # executable path; None when it is missing
    version: str
    reason: str  # why it cannot build here ("" when it can)

    @property
    def available(self) -> bool:
        return not self.reason


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@cache
def _probe(backend_type: str) -> Toolchain:
    if backend_type == "cpp":
        cxx = shutil.which(os.environ.get("CXX", "c++"))
        if cxx is None:
            return Toolchain("cpp", None, "", f"no C++ compiler ({os.environ.get('CXX', 'c++')} is not on PATH)")
        return Toolchain("cpp", cxx, _version([cxx, "--version"]), "")
    if backend_type == "cuda":
        nvcc = _nvcc()
        if nvcc is None:
            return Toolchain("cuda", None, "", "nvcc is not on PATH (set CUDA_HOME or install the CUDA toolkit)")
        import torch

        version = _version([nvcc, "--version"])
        if torch.version.cuda is None or not torch.cuda.is_available():
            return Toolchain("cuda", nvcc, version, f"no CUDA GPU for torch {torch.__version__} "
                             f"(cuda build: {torch.version.cuda}); CUDA plugins build and run where one is")
        return Toolchain("cuda", nvcc, version, "")
    if backend_type == "metal":
        if sys.platform != "darwin":
            return Toolchain("metal", None, "", f"Metal kernels compile with xcrun metal on macOS only (this is {sys.platform})")
        xcrun = shutil.which("xcrun")
        if xcrun is None:
            return Toolchain("metal", None, "", "xcrun is not on PATH (install the Xcode command line tools)")
        return Toolchain("metal", xcrun, _version([xcrun, "-sdk", "macosx", "metal", "--version"]), "")
    if backend_type == "triton":
        from importlib.metadata import PackageNotFoundError, version

        try:  # not imported here: TRITON_INTERPRET must be set before triton's first import
            found = version("triton")
        except PackageNotFoundError:
            return Toolchain("triton", None, "", "triton is not installed (pip install triton)")
        return Toolchain("triton", "triton", f"triton {found}", "")
    return Toolchain(backend_type, None, "", f"unknown backend type {backend_type!r}")


def toolchain(backend_type: str) -> Toolchain:
    """The compiler of ``backend_type`` here, probed once per process."""
    return _probe(backend_type)


def _torch_link_flags(cuda: bool) -> tuple[list[str], list[str]]:
    """Compile and link flags against the running torch. nvcc finds its own CUDA headers and links
    cudart itself, so torch's CPU include and library paths serve both (no CUDA_HOME needed)."""
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    includes = [f"-I{p}" for p in include_paths("cpu")]
    abi = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    libs: list[str] = []
    for p in library_paths("cpu"):
        libs += [f"-L{p}", *(("-Xlinker", f"-rpath,{p}") if cuda else (f"-Wl,-rpath,{p}",))]
    libs += ["-lc10", "-ltorch_cpu", "-ltorch"] + (["-lc10_cuda", "-ltorch_cuda"] if cuda else [])
    return includes + abi, libs


def build_commands(backend_type: str, compiler: str, sources: list[Path], output: Path, level: int) -> list[list[str]]:
    """The commands that build ``output`` from ``sources`` (run in order, in ``output``'s folder)."""
    opt = list(OPT_FLAGS[backend_type][level])
    units = [str(s) for s in sources if s.suffix in (".cpp", ".cc", ".cxx", ".cu", ".metal")]
    if backend_type == "cpp":
        compile_flags, libs = _torch_link_flags(cuda=False)
        return [[compiler, "-shared", "-fPIC", "-std=c++20", *opt, *compile_flags, *units, "-o", str(output), *libs]]
    if backend_type == "cuda":
        compile_flags, libs = _torch_link_flags(cuda=True)
        return [[compiler, "-shared", "-Xcompiler", "-fPIC", "-std=c++20", "--expt-relaxed-constexpr", *opt, *compile_flags, *units,
                 "-o", str(output), *libs]]
    if backend_type == "metal":
        airs = [output.with_name(Path(u).stem + ".air") for u in units]
        cmds = [[compiler, "-sdk", "macosx", "metal", *opt, "-c", u, "-o", str(a)] for u, a in zip(units, airs)]
        return [*cmds, [compiler, "-sdk", "macosx", "metallib", *map(str, airs), "-o", str(output)]]
    raise ValueError(f"no build commands for {backend_type}")


def run_commands(commands: list[list[str]], cwd: Path, timeout_s: float = 900.0) -> str:
    """Run ``commands`` in order; the full log (commands and their output). Raises CompilerError."""
    log: list[str] = []
    for cmd in commands:
        log.append("$ " + " ".join(cmd))
        try:
            out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            log.append(f"timed out after {timeout_s:.0f} s")
            raise CompilerError(f"{cmd[0]}: timed out after {timeout_s:.0f} s", "\n".join(log)) from exc
        except OSError as exc:
            log.append(str(exc))
            raise CompilerError(f"{cmd[0]}: {exc}", "\n".join(log)) from exc
        log.append(out.stdout + out.stderr)
        if out.returncode != 0:
            log.append(f"exit status {out.returncode}")
            text = "\n".join(log)
            raise CompilerError(first_error(out.stdout + "\n" + out.stderr), text)
    return "\n".join(log)


def check_python_sources(sources: list[Path]) -> str:
    """Byte-compile Triton sources (a syntax error is the compiler's first error); the log."""
    log = []
    for src in sources:
        try:
            compile(src.read_text(encoding="utf-8"), str(src), "exec")
        except SyntaxError as exc:
            first = f"{src}:{exc.lineno}: {exc.msg}"
            raise CompilerError(first, "\n".join([*log, f"SyntaxError: {first}"])) from exc
        log.append(f"checked {src}")
    return "\n".join(log)
