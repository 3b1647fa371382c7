"""ExecuTorch ``.pte`` programs: the file checked before anything loads it, loaded where a crash
cannot take the session down, and run.

ExecuTorch's loader trusts the file: a truncated program raises ``RuntimeError: Failed to load
program, error: 0x23``, and a file whose identifier (bytes 4-8) is not UTF-8 aborts the whole process
(SIGABRT, exit 134) in both of its Python APIs. So a program is checked in three steps:

1. :func:`check_program_file`: the header, read without ExecuTorch: the flatbuffer identifier
   ``ET12`` at bytes 4-8, the extended header (``eh00``, its length, the program's size, the
   segments' offset and size) and the file's size against them;
2. :func:`probe_program`: the program loaded by a child interpreter, which prints its method's
   signature (inputs and outputs, dtype and shape) as JSON: a crash there is the child's, reported
   as a DF error naming the file, and the parent never loads a program the child could not;
3. :func:`load_program`: the program loaded in this process, run by :class:`LoadedProgram`.

The runtime is imported without ``executorch.exir`` (the exporter, seconds of imports): only its
compiled extension ``executorch.extension.pybindings._C`` (after torch, whose libraries it links).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ...errors import BackendInitializationError, ModelLoadingError

if TYPE_CHECKING:
    import torch

__all__ = ["PTE_IDENTIFIER", "TensorSpec", "ProgramSignature", "ProgramHeader", "check_program_file", "probe_program",
           "load_program", "runtime", "LoadedProgram", "LoadedMethods", "SCALAR_TYPES"]

#: The flatbuffer file identifier of the program format this ExecuTorch reads (bytes 4-8).
PTE_IDENTIFIER = b"ET12"
#: The extended header's magic (bytes 8-12) and its shortest length (magic, length, program size, segment offset).
_EXTENDED_MAGIC = b"eh00"
_EXTENDED_MIN = 24
#: ExecuTorch's ``ScalarType`` codes -> the dtype names of the framework (and torch)
SCALAR_TYPES: dict[int, str] = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                                7: "float64", 11: "bool", 15: "bfloat16"}
#: Seconds the child interpreter may take to load a program and describe it.
PROBE_TIMEOUT_S = 300.0

_WHAT_TO_DO = "export the program again (executorch's to_executorch().write_to_file) or pass the file it was saved as"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a program's method: its dtype (``"float32"``, ``"int64"`` ...) and shape."""

    dtype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, object]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ProgramSignature:
    """A program's ``forward`` method as ExecuTorch describes it: its inputs and outputs, in order."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    methods: tuple[str, ...] = ("forward",)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProgramSignature:
        def specs(key: str) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(str(s["dtype"]), tuple(int(d) for d in s["shape"]))  # type: ignore[index,union-attr]
                         for s in data[key])  # type: ignore[union-attr]

        return cls(specs("inputs"), specs("outputs"), tuple(str(m) for m in data.get("methods", ("forward",))))  # type: ignore[union-attr]


@dataclass(frozen=True)
class ProgramHeader:
    """What a ``.pte`` file's header says: its format identifier and its sizes."""

    identifier: str
    program_size: int
    segment_base_offset: int
    segment_data_size: int
    file_size: int


def _refuse(path: Path, why: str) -> ModelLoadingError:
    """DF004 naming the program file and what is wrong with it."""
    return ModelLoadingError(f"{path.name} is not an ExecuTorch program this runtime can load: {why}",
                             hint=_WHAT_TO_DO, file=str(path))


def check_program_file(path: str | Path) -> ProgramHeader:
    """Read and check the header of the ``.pte`` file ``path`` without ExecuTorch.

    Raises:
        ModelLoadingError: the file is missing, not a regular file, has no ``ET12`` identifier at
            bytes 4-8 (a non-UTF-8 one included), or is shorter than its header says (DF004, naming it).
    """
    p = Path(path).expanduser()
    if p.suffix.lower() != ".pte":
        raise _refuse(p, "the file name does not end in .pte")
    if not p.is_file():
        raise ModelLoadingError(f"the ExecuTorch program {p.name} does not exist or is not a regular file",
                                hint="pass the path of a .pte file", file=str(p))
    size = p.stat().st_size
    with p.open("rb") as fh:
        head = fh.read(8 + 32)
    if len(head) < 8:
        raise _refuse(p, f"it is {size} bytes long, shorter than a program's header")
    identifier = head[4:8]
    if identifier != PTE_IDENTIFIER:
        shown = identifier.decode("ascii") if identifier.isascii() and identifier.isalnum() else identifier.hex(" ")
        why = (f"its format is {shown}, this ExecuTorch reads {PTE_IDENTIFIER.decode()}" if identifier[:2] == b"ET"
               and identifier.isascii() else f"bytes 4-8 are {shown}, not the program identifier "
               f"{PTE_IDENTIFIER.decode()}")
        raise _refuse(p, why)
    extended = head[8:]
    if len(extended) < _EXTENDED_MIN or extended[:4] != _EXTENDED_MAGIC:
        raise _refuse(p, "it has no extended header (eh00) after the identifier")
    length = int.from_bytes(extended[4:8], "little")
    program_size = int.from_bytes(extended[8:16], "little")
    segment_base = int.from_bytes(extended[16:24], "little")
    segment_size = int.from_bytes(extended[24:32], "little") if length > _EXTENDED_MIN and len(extended) >= 32 else 0
    if length < _EXTENDED_MIN or program_size < 8 + length:
        raise _refuse(p, f"its header is inconsistent (header length {length}, program size {program_size})")
    if program_size > size:
        raise _refuse(p, f"it is truncated: {size} bytes, the program alone is {program_size}")
    if segment_base and segment_base + segment_size > size:
        raise _refuse(p, f"it is truncated: {size} bytes, its data segments end at byte {segment_base + segment_size}")
    return ProgramHeader(identifier.decode(), program_size, segment_base, segment_size, size)


#: What the child interpreter runs: the runtime alone, the program loaded, its signature printed as JSON.
_PROBE = """
import json, sys
import torch
from executorch.extension.pybindings import _C
codes = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
         11: "bool", 15: "bfloat16"}
module = _C._load_for_executorch(sys.argv[1])
meta = module.method_meta("forward")
def spec(info):
    return {"dtype": codes.get(int(info.dtype()), "code %d" % int(info.dtype())), "shape": list(info.sizes())}
print("PROGRAM:" + json.dumps({
    "methods": list(module.method_names()),
    "inputs": [spec(meta.input_tensor_meta(i)) for i in range(meta.num_inputs())],
    "outputs": [spec(meta.output_tensor_meta(i)) for i in range(meta.num_outputs())],
}))
"""


def probe_program(path: Path, backend: str) -> ProgramSignature:
    """Load the program ``path`` in a child interpreter and read its ``forward`` method's signature.

    Raises:
        ModelLoadingError: ExecuTorch refused the program or crashed loading it (DF004, naming the file).
        BackendInitializationError: the child could not run at all (DF002).
    """
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True,
                              errors="replace", timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendInitializationError(f"could not load {path.name} in a child interpreter: {exc}",
                                         backend=backend, file=str(path)) from exc
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PROGRAM:")), None)
    if done.returncode == 0 and line is not None:
        return ProgramSignature.from_json(json.loads(line.removeprefix("PROGRAM:")))
    said = _runtime_message(done.stderr)
    if done.returncode < 0:
        import signal

        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        raise _refuse(path, f"ExecuTorch's loader crashed on it ({name}){said}")
    if "No module named" in done.stderr:
        raise BackendInitializationError(f"the ExecuTorch runtime cannot be imported{said}", backend=backend,
                                         hint="pip install 'multi-backend-debug-framework[executorch]'")
    raise _refuse(path, f"ExecuTorch refused it{said}")


def _runtime_message(stderr: str) -> str:
    """The last line of what the runtime printed that says why (``RuntimeError: ...``), as ``": ..."``."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    why = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    return f": {why[:300]}" if why else ""


def runtime() -> ModuleType:
    """ExecuTorch's runtime extension (``executorch.extension.pybindings._C``), imported after
    torch and without the exporter."""
    import torch  # noqa: F401 - loads libtorch, which the extension links

    from executorch.extension.pybindings import _C

    return _C


class LoadedProgram:
    """A program loaded in this process: :meth:`run` feeds its ``forward`` method positionally.

    Args:
        path: the ``.pte`` file.
        etdump: load it with ETDump collection and a debug buffer of ``debug_buffer_size`` bytes
            (each intermediate value of the run recorded, what ExecuTorch's Inspector reads).
    """

    def __init__(self, path: Path, *, etdump: bool = False, debug_buffer_size: int = 0) -> None:
        self.path = path
        self.etdump = etdump
        self._module = runtime()._load_for_executorch(str(path), enable_etdump=etdump,
                                                     debug_buffer_size=debug_buffer_size)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs of ``forward`` for ``inputs`` (tensors, in the program's input order), cloned."""
        return list(self._module.forward(inputs))

    def write_etdump(self, path: Path) -> Path:
        """Write the ETDump (and debug buffer) of the runs so far to ``path``; returns ``path``."""
        debug = path.with_suffix(".debug.bin")
        self._module.write_etdump_result_to_file(str(path), str(debug))
        return path


class LoadedMethods:
    """A program of several methods sharing its mutable state (a static KV cache exported with
    ``share_mutable_buffers``: :func:`~.lowering.lower_methods_to_file`), loaded in this process
    through ``executorch.runtime``, whose methods of one program share one set of host arenas (the
    pybindings' ``Module`` plans each method's memory apart, so one method would not see another's
    writes). :meth:`run` calls one method by name.
    """

    def __init__(self, path: Path) -> None:
        runtime()  # torch first: the runtime links its libraries
        from executorch.runtime import Runtime

        self.path = path
        self._program = Runtime.get().load_program(str(path))
        self.methods = tuple(sorted(self._program.method_names))

    def run(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs of ``method`` for ``inputs`` (contiguous tensors, in the method's input order)."""
        return list(self._program.load_method(method).execute([t.contiguous() for t in inputs]))


def load_program(path: Path, *, etdump: bool = False, debug_buffer_size: int = 0) -> LoadedProgram:
    """The program ``path`` loaded in this process (check and probe it first: see the module's docstring)."""
    return LoadedProgram(path, etdump=etdump, debug_buffer_size=debug_buffer_size)
