"""Loading a built plugin: its kernels as callable torch operators, with their references.

C++ and CUDA libraries register their operators themselves (``TORCH_LIBRARY``) and are loaded with
``torch.ops.load_library``; a Triton source is imported and each entry function is registered as
an operator of the namespace ``dfplugin_<id>`` with the kernel's schema, so every kernel is called,
swapped in and checked by ``torch.library.opcheck`` the same way. A process loads one build of a
library namespace; a rebuilt plugin is seen by a new process (the sweep's worker is one).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch._ops import OpOverload

from ..errors import PluginCompilationError
from .manifest import KernelSpec, PluginDefinition

__all__ = ["LoadedKernel", "load_plugin", "resolve_op", "load_reference", "aten_overload", "file_digest",
           "load_library", "triton_mode"]

_LOADED_LIBRARIES: dict[str, Path] = {}  # artifact digest -> the path loaded
_TRITON_LIBS: dict[str, torch.library.Library] = {}  # namespace -> torch.library.Library keeping its registrations alive


@dataclass
class LoadedKernel:
    """A kernel ready to run: the plugin's operator, the reference, the ATen op it replaces (if any)."""

    spec: KernelSpec
    op: Callable[..., object]  # torch.ops.<ns>.<name>.default
    reference: Callable[..., object]
    aten: OpOverload | None  # the ATen OpOverload for ATen kernels
    notes: list[str]


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resolve_op(name: str) -> OpOverload:
    """The ``OpOverload`` of ``ns::name[.overload]`` (``default`` when no overload is named)."""
    qual, _, overload = name.partition(".")
    ns, _, op = qual.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        found: OpOverload = getattr(packet, overload or "default")
        return found
    except (AttributeError, RuntimeError) as exc:
        raise PluginCompilationError(f"operator {name} is not registered", op=name,
                                     hint="the library must register it with TORCH_LIBRARY (see docs/plugins.md)") from exc


def aten_overload(spec: KernelSpec) -> OpOverload:
    """The ATen ``OpOverload`` an ATen kernel implements."""
    return resolve_op(spec.op_name)


def load_library(artifact: Path) -> None:
    """``torch.ops.load_library`` once per artifact content (a copy of a loaded build is not reloaded)."""
    digest = file_digest(artifact)
    if digest in _LOADED_LIBRARIES:
        return
    try:
        torch.ops.load_library(str(artifact))
    except (OSError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PluginCompilationError(f"cannot load the built library: {first}", artifact=str(artifact),
                                     hint="rebuild it with plugin_compile; a namespace can be registered by one "
                                          "library per process") from exc
    _LOADED_LIBRARIES[digest] = artifact


def load_reference(defn: PluginDefinition, spec: KernelSpec) -> Callable[..., object]:
    """The function a kernel must match: the ATen op itself, or ``file.py:function`` of the plugin."""
    if spec.reference is None:
        return aten_overload(spec)
    file, _, fn = spec.reference.partition(":")
    module = _import_file(defn.root / file, f"dfplugin_ref_{_ns(defn.id)}_{Path(file).stem}")
    ref = getattr(module, fn, None)
    if not callable(ref):
        raise PluginCompilationError(f"the reference {spec.reference!r} is not a function", plugin=defn.id,
                                     field=f"kernels.{spec.name}.reference")
    return ref


def _ns(plugin_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", plugin_id)


def _import_file(path: Path, module_name: str) -> ModuleType:
    """The plugin file ``path`` imported as ``module_name`` (once: a module already imported from it is reused)."""
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path):
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginCompilationError("cannot import the plugin source", file=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(path.parent)  # a plugin's other sources sit beside its entry module: importable while it loads
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the plugin's own code: its failure is the plugin's
        del sys.modules[module_name]
        raise PluginCompilationError(f"importing the plugin source failed: {type(exc).__name__}: {exc}",
                                     file=str(path)) from exc
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    return module


def _triton_compiled_already() -> bool:
    """Whether Triton's language library was imported in compiled (not interpreted) mode."""
    standard = sys.modules.get("triton.language.standard")
    fn = getattr(standard, "max", None)
    return fn is not None and type(fn).__name__ == "JITFunction"


def triton_mode(defn: PluginDefinition) -> None:
    """Kernels declared for "cpu" run in Triton's interpreter (on CPU tensors, GPU or not), "cuda" ones
    compile for the GPU. Triton reads ``TRITON_INTERPRET`` when the source is imported and again when
    a kernel runs, so it is process-wide: a GPU plugin cannot load into an interpreting process."""
    interpret = all(spec.devices[0] == "cpu" for spec in defn.kernels)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        if _triton_compiled_already():
            raise PluginCompilationError(
                "this Triton plugin's kernels run in Triton's interpreter (declared for \"cpu\"), but Triton was "
                "already imported in this process for compiled kernels (by Inductor or another GPU plugin), and its "
                "own library cannot switch modes", plugin=defn.id,
                hint="set TRITON_INTERPRET=1 before starting the process, or validate the plugin in a fresh process")
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise PluginCompilationError(
            "this Triton plugin's kernels are declared for the GPU, but this process runs Triton's interpreter "
            "(TRITON_INTERPRET is set: by your environment, or by a CPU Triton plugin loaded earlier)",
            plugin=defn.id, hint="unset TRITON_INTERPRET, or load GPU and CPU Triton plugins in separate processes")


def _schema_without_name(spec: KernelSpec) -> str:
    """``name(args) -> returns`` of the kernel: the custom schema, or the ATen op's schema renamed."""
    full = spec.op if not spec.is_aten else str(aten_overload(spec)._schema)
    args = full[full.index("("):]
    return spec.name + args


def _register_python_kernels(defn: PluginDefinition, artifact: Path) -> str:
    """Register each Triton entry function as ``dfplugin_<id>::<kernel>``; the namespace."""
    ns = f"dfplugin_{_ns(defn.id)}"
    triton_mode(defn)  # also when already registered: the interpreter is read again at every call
    if ns in _TRITON_LIBS:
        return ns
    module = _import_file(artifact, f"{ns}_{file_digest(artifact)[:12]}")
    lib = torch.library.Library(ns, "FRAGMENT")
    for spec in defn.kernels:
        fn = getattr(module, spec.entry, None)
        if not callable(fn):
            raise PluginCompilationError(f"the source has no function {spec.entry!r}", plugin=defn.id,
                                         field=f"kernels.{spec.name}.entry", file=str(artifact))
        lib.define(_schema_without_name(spec))
        lib.impl(spec.name, fn, "CompositeExplicitAutograd")
    _TRITON_LIBS[ns] = lib
    return ns


def _check_schema(spec: KernelSpec, op: OpOverload, plugin_id: str) -> None:
    """The registered operator takes the arguments of the op it implements (types, order, kwarg-only)."""
    want = torch._C.parse_schema(spec.op) if not spec.is_aten else aten_overload(spec)._schema
    got = op._schema

    def shape(s: torch._C.FunctionSchema) -> list[tuple[str, bool]]:
        return [(str(a.type), bool(a.kwarg_only)) for a in s.arguments]

    if shape(got) != shape(want):
        raise PluginCompilationError(
            f"{spec.entry} has schema {got} but {spec.op_name} takes ({', '.join(t for t, _ in shape(want))})",
            plugin=plugin_id, field=f"kernels.{spec.name}.entry",
            hint="give the kernel the same arguments as the operator it implements")


def _ensure_fake(qualname: str, reference: Callable[..., object], notes: list[str]) -> None:
    """Give an operator without a Meta/fake kernel the reference as its fake kernel (for opcheck and tracing)."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta"):
        return
    try:
        torch.library.register_fake(qualname, lambda *a, **k: reference(*a, **k))
        notes.append("fake kernel supplied from the reference")
    except RuntimeError:
        pass  # already registered (by this process, or in the library as an abstract impl)


def load_plugin(defn: PluginDefinition, artifact: str | Path) -> dict[str, LoadedKernel]:
    """Load ``artifact`` (the plugin's build) and return its kernels by name, schemas checked.

    Raises:
        PluginCompilationError (DF008): the artifact cannot be loaded, an entry is missing, or an
            entry's schema does not match the operator it implements.
    """
    path = Path(artifact)
    if not path.is_file():
        raise PluginCompilationError("the plugin's build artifact does not exist", artifact=str(path),
                                     hint="compile it first: python -m debug_framework.cli.plugin_compile")
    if defn.backend_type == "metal":
        raise PluginCompilationError("Metal kernels cannot be called from torch here", plugin=defn.id,
                                     hint="Metal plugins are compiled and symbol-checked; run them through the "
                                          "metal backend on macOS")
    if defn.backend_type == "triton":
        ns = _register_python_kernels(defn, path)
        entries = {s.name: f"{ns}::{s.name}" for s in defn.kernels}
    else:
        load_library(path)
        entries = {s.name: s.entry for s in defn.kernels}
    out: dict[str, LoadedKernel] = {}
    for spec in defn.kernels:
        op = resolve_op(entries[spec.name])
        _check_schema(spec, op, defn.id)
        reference = load_reference(defn, spec)
        notes: list[str] = []
        _ensure_fake(entries[spec.name].split(".")[0], reference, notes)
        out[spec.name] = LoadedKernel(spec, op, reference, aten_overload(spec) if spec.is_aten else None, notes)
    return out
