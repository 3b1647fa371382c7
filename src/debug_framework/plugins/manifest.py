"""The plugin manifest (``plugin.json`` beside the sources): what a kernel plugin is.

    {
      "id": "example-cpp", "version": "1.0.0", "backend": "cpp",
      "sources": ["kernels.cpp"],
      "kernels": [
        {"name": "gelu", "op": "aten::gelu", "entry": "df_example::gelu", "dtypes": ["float32", "float64"]},
        {"name": "rms_norm", "op": "df_example::rms_norm(Tensor x, Tensor w, float eps) -> Tensor",
         "entry": "df_example::rms_norm", "reference": "reference.py:rms_norm", "dtypes": ["float32"],
         "inputs": {"x": "...,D", "w": "D"}, "args": {"eps": 1e-6},
         "swap_module": {"class": "LlamaRMSNorm", "args": ["input", "weight", "variance_epsilon"]}}
      ]
    }

A kernel implements an ATen operator (``aten::name[.overload]``: its schema and reference are
PyTorch's own) or a custom operator given with its full schema plus the Python reference it must
match (``file.py:function`` beside the manifest). ``entry`` is what the built artifact provides: the
operator the C++/CUDA library registers (``ns::name``), or the Python function of a Triton source
(``softmax``). docs/plugins.md documents every field. Any problem is a
:class:`~debug_framework.errors.PluginCompilationError` (DF008) naming the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

from ..errors import PluginCompilationError
from ..jsonio import JsonObject, JsonValue
from ..safefiles import MAX_CONFIG_BYTES, read_strict_json, size_text

if TYPE_CHECKING:
    import torch

_T = TypeVar("_T")

__all__ = ["BACKEND_TYPES", "DTYPES", "KernelSpec", "ModuleSwap", "PluginDefinition", "load_manifest",
           "parse_manifest", "source_digest", "MANIFEST_NAME"]

#: The backend types a plugin can target.
BACKEND_TYPES = ("cpp", "cuda", "triton", "metal")
#: Dtypes a kernel may declare.
DTYPES = ("float16", "bfloat16", "float32", "float64")
#: The manifest's file name when a directory is given.
MANIFEST_NAME = "plugin.json"

# anchored with \Z (``$`` would let a final newline through); used with fullmatch
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_OP = re.compile(r"^(?P<ns>[A-Za-z_][A-Za-z0-9_]*)::(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<overload>[A-Za-z0-9_]+))?\Z")
_SCHEMA = re.compile(r"^(?P<qual>[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*)\((?P<args>.*)\)[ \t]*->[ \t]*(?P<ret>[^\n]+)\Z")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")
_DIMS = re.compile(r"(\.\.\.)?(,?[A-Za-z][A-Za-z0-9_]*)*\Z")
_TOP_FIELDS = {"id", "version", "backend", "sources", "kernels", "description", "format"}
_KERNEL_FIELDS = {"name", "op", "entry", "reference", "dtypes", "inputs", "args", "opinfo", "swap_module",
                  "devices"}
_SOURCE_SUFFIXES = {"cpp": (".cpp", ".cc", ".cxx", ".h", ".hpp"), "cuda": (".cu", ".cuh", ".cpp", ".cc", ".h"),
                    "triton": (".py",), "metal": (".metal", ".h")}


def _bad(message: str, manifest: Path | None, field_name: str, hint: str | None = None) -> PluginCompilationError:
    return PluginCompilationError(message, hint=hint or "fix the manifest (docs/plugins.md lists its fields)",
                                  manifest=None if manifest is None else str(manifest), field=field_name)


@dataclass(frozen=True)
class ModuleSwap:
    """Model-level swap-in of a custom op: modules of class ``cls`` return ``op(*args)``, where each
    name of ``args`` is ``"input"`` (the module's first input) or an attribute of the module."""

    cls: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of a plugin: the operator it implements and how to call and judge it."""

    name: str
    op: str  # "aten::gelu" / "aten::softmax.int" or the custom op's full schema
    entry: str
    dtypes: tuple[str, ...] = ("float32",)
    reference: str | None = None  # "file.py:function" (custom ops); None: the ATen op itself
    inputs: dict[str, str] = field(default_factory=dict)  # tensor argument -> dims ("...,D")
    args: dict[str, JsonValue] = field(default_factory=dict)  # non-tensor argument values for fuzzing
    opinfo: str | None = None  # OpInfo name whose samples apply (ATen ops; default: found by name)
    swap_module: ModuleSwap | None = None
    devices: tuple[str, ...] = ("cpu",)

    @property
    def is_aten(self) -> bool:
        return self.op.startswith("aten::") and "(" not in self.op

    @property
    def op_name(self) -> str:
        """``ns::name[.overload]`` without the schema."""
        return self.op.split("(", 1)[0]

    def to_dict(self) -> JsonObject:
        """The kernel as JSON (the manifest's fields)."""
        d: JsonObject = asdict(self)
        d["swap_module"] = None if self.swap_module is None else {"class": self.swap_module.cls,
                                                                  "args": list(self.swap_module.args)}
        return d


@dataclass(frozen=True)
class PluginDefinition:
    """A parsed manifest: identity, backend type, sources (absolute) and kernels."""

    id: str
    version: str
    backend_type: str
    sources: tuple[Path, ...]
    kernels: tuple[KernelSpec, ...]
    manifest_path: Path | None = None
    description: str = ""

    @property
    def root(self) -> Path:
        """The directory the manifest's relative paths start from."""
        return self.manifest_path.parent if self.manifest_path is not None else self.sources[0].parent

    def kernel(self, name: str) -> KernelSpec:
        for k in self.kernels:
            if k.name == name:
                return k
        raise PluginCompilationError(f"plugin {self.id!r} has no kernel {name!r}", plugin=self.id,
                                     hint=f"its kernels: {', '.join(k.name for k in self.kernels) or 'none'}")

    @property
    def digest(self) -> str:
        """SHA-256 of the definition's content (every field, the sources' bytes) with its id: two
        definitions registered under one id are told apart by it (the registry keys runs by
        ``(id, digest)``, so a validation never reports another definition's kernels)."""
        fields = {k: v for k, v in self.to_dict().items() if k not in ("sources", "manifest_path")}
        text = json.dumps(fields, sort_keys=True, default=str) + "\0" + source_digest(list(self.sources))
        return hashlib.sha256(text.encode()).hexdigest()

    def to_dict(self) -> JsonObject:
        """The manifest as JSON (paths absolute), as the registry stores it."""
        return {"id": self.id, "version": self.version, "backend": self.backend_type,
                "sources": [str(s) for s in self.sources], "kernels": [k.to_dict() for k in self.kernels],
                "manifest_path": None if self.manifest_path is None else str(self.manifest_path),
                "description": self.description}

    @classmethod
    def from_dict(cls, data: JsonObject) -> PluginDefinition:
        """Inverse of :meth:`to_dict` (what the registry reads back)."""
        kernels = []
        for k in data["kernels"]:
            swap = k.get("swap_module")
            kernels.append(KernelSpec(
                name=k["name"], op=k["op"], entry=k["entry"], dtypes=tuple(k["dtypes"]), reference=k.get("reference"),
                inputs=dict(k.get("inputs") or {}), args=dict(k.get("args") or {}), opinfo=k.get("opinfo"),
                swap_module=None if not swap else ModuleSwap(swap["class"], tuple(swap["args"])),
                devices=tuple(k.get("devices") or ("cpu",))))
        manifest = data.get("manifest_path")
        return cls(data["id"], data["version"], data["backend"], tuple(Path(s) for s in data["sources"]),
                   tuple(kernels), None if manifest is None else Path(manifest), data.get("description", ""))


def source_digest(paths: tuple[Path, ...] | list[Path]) -> str:
    """SHA-256 over the sources' names and bytes, in order (part of the build cache key)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _require(data: Mapping[str, object], key: str, kind: type[_T] | tuple[type[_T], ...], manifest: Path | None,
             where: str = "") -> _T:
    """``data[key]``, checked to be of ``kind``; DF008 naming the field otherwise."""
    if key not in data:
        raise _bad(f"the manifest has no {where}{key!r}", manifest, where + key)
    value = data[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _bad(f"{where}{key!r} must be a {names}, got {type(value).__name__}", manifest, where + key)
    return value


def _check_unknown(data: Mapping[str, object], known: set[str], manifest: Path | None, where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise _bad(f"unknown field(s) {', '.join(map(repr, unknown))} in {where or 'the manifest'}", manifest,
                   where + unknown[0], hint=f"known fields: {', '.join(sorted(known))}")


def _inside(root: Path, rel: str, manifest: Path | None, field_name: str) -> Path:
    """``root / rel`` resolved, refusing absolute paths and paths leaving ``root``."""
    if not rel or Path(rel).is_absolute():
        raise _bad(f"{field_name} must be a path relative to the manifest, got {rel!r}", manifest, field_name)
    path = (root / rel).resolve()
    if root.resolve() not in path.parents:
        raise _bad(f"{field_name} {rel!r} leaves the plugin's directory", manifest, field_name)
    if not path.is_file():
        raise _bad(f"{field_name} {rel!r} does not exist", manifest, field_name, hint=f"looked for {path}")
    return path


def check_schema(schema: str, manifest: Path | None, field_name: str) -> None:
    """A custom op's schema must parse as ``ns::name(args) -> returns`` (torch's own parser decides)."""
    if not _SCHEMA.fullmatch(schema):
        raise _bad(f"{field_name} {schema!r} is not an operator schema like 'ns::name(Tensor x) -> Tensor'",
                   manifest, field_name)
    import torch

    try:
        torch._C.parse_schema(schema)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise _bad(f"{field_name} is not a valid operator schema: {first}", manifest, field_name) from exc


def _op_schema(op: str) -> torch._C.FunctionSchema | None:
    """The ``FunctionSchema`` of a kernel's op when it can be known here (a custom op's schema was
    checked by :func:`check_schema`; an ATen op is looked up), else None."""
    import torch

    if "(" in op:
        return torch._C.parse_schema(op)
    qual, _, overload = op.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, qual.split("::", 1)[1]), overload or "default")._schema
    except (AttributeError, RuntimeError, IndexError):
        return None  # not an ATen op of this torch: the build checks report it


def _fits(value: object, type_text: str) -> bool:
    """Whether the JSON value fits an argument of the schema type ``type_text`` (``float``, ``int[]``, ``bool?`` ...)."""
    if type_text.endswith("?"):
        return value is None or _fits(value, type_text[:-1])
    if type_text.endswith("]"):
        inner = type_text[: type_text.index("[")]
        return isinstance(value, list) and all(_fits(v, inner) for v in value) or (
            type_text != inner + "[]" and _fits(value, inner))  # int[2] also takes one int
    if type_text in ("float", "SymFloat"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_text in ("int", "SymInt"):
        return isinstance(value, int) and not isinstance(value, bool)
    if type_text == "bool":
        return isinstance(value, bool)
    if type_text == "str":
        return isinstance(value, str)
    if type_text == "Scalar":
        return isinstance(value, int | float | bool)
    if type_text == "Tensor":
        return False
    return isinstance(value, str | int | float | bool)  # ScalarType, Layout, Device ...: passed as given


def _check_args(args: Mapping[str, object], schema: torch._C.FunctionSchema | None, manifest: Path | None, where: str) -> None:
    """Every ``args`` value names a non-tensor argument of the op and fits its type."""
    types = {} if schema is None else {a.name: str(a.type) for a in schema.arguments}
    for name, value in args.items():
        if schema is not None and name not in types:
            raise _bad(f"{where} names {name!r}, which is not an argument of the op", manifest, f"{where}.{name}",
                       hint=f"its arguments: {', '.join(types) or 'none'}")
        kind = types.get(name, "")
        if kind == "Tensor":
            raise _bad(f"{where}.{name} is a tensor argument: give its dims in inputs, not a value in args",
                       manifest, f"{where}.{name}")
        if not _fits(value, kind) if kind else not (value is None or isinstance(value, str | int | float | bool)
                                                     or isinstance(value, list)):
            raise _bad(f"{where}.{name} must be a value of type {kind or 'number/bool/str/list'}, got {value!r}",
                       manifest, f"{where}.{name}")


def _kernel(raw: object, i: int, root: Path, backend: str, manifest: Path | None) -> KernelSpec:
    where = f"kernels[{i}]."
    if not isinstance(raw, dict):
        raise _bad(f"kernels[{i}] must be an object", manifest, f"kernels[{i}]")
    _check_unknown(raw, _KERNEL_FIELDS, manifest, where)
    name = _require(raw, "name", str, manifest, where)
    if not _NAME.fullmatch(name):
        raise _bad(f"{where}name {name!r} must be an identifier", manifest, where + "name")
    op = _require(raw, "op", str, manifest, where)
    entry = _require(raw, "entry", str, manifest, where)
    if "(" in op:
        check_schema(op, manifest, where + "op")
        if not raw.get("reference"):
            raise _bad(f"{where}reference is required for a custom op (file.py:function it must match)", manifest,
                       where + "reference")
    elif not _OP.fullmatch(op) or not op.startswith("aten::"):
        raise _bad(f"{where}op {op!r} must be an ATen op ('aten::gelu') or a custom op with its schema",
                   manifest, where + "op")
    if backend in ("cpp", "cuda") and not _OP.fullmatch(entry):
        raise _bad(f"{where}entry {entry!r} must name the operator the library registers ('ns::name')",
                   manifest, where + "entry")
    if backend in ("triton", "metal") and not _NAME.fullmatch(entry):
        raise _bad(f"{where}entry {entry!r} must be a function name of the source", manifest, where + "entry")
    raw_dtypes = raw.get("dtypes") or ["float32"]
    if not isinstance(raw_dtypes, list) or not all(isinstance(d, str) for d in raw_dtypes):
        raise _bad(f"{where}dtypes must be a list of dtype names", manifest, where + "dtypes", hint=f"use {DTYPES}")
    dtypes = tuple(raw_dtypes)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise _bad(f"{where}dtypes has unknown dtype(s) {bad}", manifest, where + "dtypes", hint=f"use {DTYPES}")
    reference = raw.get("reference")
    if reference is not None:
        if not isinstance(reference, str):
            raise _bad(f"{where}reference must be 'file.py:function'", manifest, where + "reference")
        file, _, fn = reference.partition(":")
        _inside(root, file, manifest, where + "reference")
        if not _NAME.fullmatch(fn):
            raise _bad(f"{where}reference must be 'file.py:function', got {reference!r}", manifest, where + "reference")
    inputs = raw.get("inputs") or {}
    if not isinstance(inputs, dict) or not all(isinstance(v, str) and _DIMS.fullmatch(v.replace(" ", ""))
                                               and _NAME.fullmatch(k) for k, v in inputs.items()):
        raise _bad(f"{where}inputs must map tensor arguments to dims like '...,D'", manifest, where + "inputs")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise _bad(f"{where}args must be an object of argument values", manifest, where + "args")
    _check_args(args, _op_schema(op), manifest, where + "args")
    swap = raw.get("swap_module")
    module_swap = None
    if swap is not None:
        if not isinstance(swap, dict) or not isinstance(swap.get("class"), str) or not isinstance(swap.get("args"), list):
            raise _bad(f"{where}swap_module must be {{'class': name, 'args': [...]}}", manifest, where + "swap_module")
        if not _NAME.fullmatch(swap["class"]) or not all(isinstance(a, str) and _NAME.fullmatch(a)
                                                         for a in swap["args"]):
            raise _bad(f"{where}swap_module's class and args must be identifiers", manifest, where + "swap_module")
        module_swap = ModuleSwap(swap["class"], tuple(swap["args"]))
    devices = raw.get("devices") or (["cuda"] if backend == "cuda" else ["cpu"])
    if not isinstance(devices, list) or not devices or any(d not in ("cpu", "cuda", "mps") for d in devices):
        raise _bad(f"{where}devices must be a non-empty list of \"cpu\", \"cuda\" or \"mps\"", manifest, where + "devices")
    if raw.get("opinfo") is not None and not isinstance(raw.get("opinfo"), str):
        raise _bad(f"{where}opinfo must be the name of an OpInfo entry", manifest, where + "opinfo")
    return KernelSpec(name, op, entry, dtypes, reference, {k: v.replace(" ", "") for k, v in inputs.items()},
                      dict(args), raw.get("opinfo"), module_swap, tuple(devices))


def parse_manifest(data: object, manifest: Path | None = None, root: Path | None = None) -> PluginDefinition:
    """Check and parse a manifest object (``root``: where relative paths start; default the manifest's folder)."""
    if not isinstance(data, dict):
        raise _bad("the manifest must be a JSON object", manifest, "(top level)")
    _check_unknown(data, _TOP_FIELDS, manifest, "")
    base = root if root is not None else (manifest.parent if manifest is not None else Path.cwd())
    pid = _require(data, "id", str, manifest)
    if not _ID.fullmatch(pid):
        raise _bad(f"id {pid!r} must be letters, digits, '_', '-' or '.' (at most 64)", manifest, "id")
    version_raw = _require(data, "version", (str, int, float), manifest)
    if isinstance(version_raw, bool) or (isinstance(version_raw, str) and not _VERSION.fullmatch(version_raw)):
        raise _bad(f"version {version_raw!r} must be a version like '1.0.0'", manifest, "version")
    version = str(version_raw)
    backend = _require(data, "backend", str, manifest)
    if backend not in BACKEND_TYPES:
        raise _bad(f"backend {backend!r} is not one of {', '.join(BACKEND_TYPES)}", manifest, "backend")
    sources = _require(data, "sources", list, manifest)
    if not sources:
        raise _bad("sources is empty", manifest, "sources")
    for i, s in enumerate(sources):
        if not isinstance(s, str) or not s or any(ch in s for ch in "\0\n\r"):
            raise _bad(f"sources[{i}] must be a relative path (a string without NUL or line breaks)", manifest,
                       f"sources[{i}]")
    paths = tuple(_inside(base, s, manifest, f"sources[{i}]") for i, s in enumerate(sources))
    for i, p in enumerate(paths):
        if p.suffix not in _SOURCE_SUFFIXES[backend]:
            raise _bad(f"sources[{i}] {p.name!r} is not a {backend} source ({', '.join(_SOURCE_SUFFIXES[backend])})",
                       manifest, f"sources[{i}]")
    kernels_raw = _require(data, "kernels", list, manifest)
    if not kernels_raw:
        raise _bad("kernels is empty: a plugin declares at least one kernel", manifest, "kernels")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _bad("description must be a string", manifest, "description")
    kernels = tuple(_kernel(k, i, base, backend, manifest) for i, k in enumerate(kernels_raw))
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise _bad("two kernels share a name", manifest, "kernels")
    if backend == "triton" and len({k.devices[0] == "cpu" for k in kernels}) > 1:
        raise _bad("a triton plugin's kernels run either in Triton's interpreter (devices [\"cpu\"]) or on the GPU "
                   "(devices [\"cuda\"]), not both: Triton chooses when the source is imported", manifest, "kernels",
                   hint="split the plugin in two, or give every kernel the same first device")
    return PluginDefinition(pid, version, backend, paths, kernels, manifest, description)


def load_manifest(path: str | Path) -> PluginDefinition:
    """Read and check the manifest at ``path`` (a ``plugin.json`` file or the folder holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / MANIFEST_NAME
    data = read_strict_json(p, "plugin manifest", error=PluginCompilationError,
                            hint="pass the plugin's plugin.json (or its folder), strict UTF-8 JSON "
                                 f"of at most {size_text(MAX_CONFIG_BYTES)} (docs/plugins.md)")
    return parse_manifest(data, p.resolve())
