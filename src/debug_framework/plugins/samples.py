"""The op sweep's samples: PyTorch's OpInfo samples where the op has an entry, fuzzing of shapes,
strides, dtypes and special values, and shapes recorded from a real model run.

Fuzzing follows the kernel's declared ``inputs`` (tensor argument -> dims, e.g. ``{"x": "...,D",
"w": "D"}``: named dims are shared between arguments, ``...`` is any number of leading dims) and
``args`` (values of the other arguments; else the schema's defaults). An ATen kernel whose first
argument is its only tensor needs no declaration (``...``). Every sample is made from a seeded
generator, so the worker process regenerates exactly the list the parent reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import torch

from ..jsonio import JsonObject, JsonValue
from .manifest import KernelSpec

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

_V = TypeVar("_V")

__all__ = ["Sample", "make_samples", "describe_value", "OPINFO_LIMIT", "schema_of", "upcast", "on_device",
           "relayout", "with_special", "FUZZ_SHAPES", "LAYOUTS", "SPECIALS", "MAGNITUDES"]

#: OpInfo samples taken per dtype (BackendBench runs about 13 per op).
OPINFO_LIMIT = 16
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
_SHAPES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((), 1), ((3,), 7), ((0,), 5), ((2, 5), 33), ((4,), 0), ((2, 3), 1), ((64,), 1031), ((8,), 4099),
)
_BASE: tuple[tuple[int, ...], int] = ((4, 3), 17)  # the layout for stride/special/magnitude samples


@dataclass
class Sample:
    """One call of a kernel: where it came from, its dtype, its arguments."""

    source: str  # opinfo | shape | stride | special | magnitude | model
    label: str
    dtype: str
    args: list[object]
    kwargs: dict[str, object] = field(default_factory=dict)

    def describe(self) -> JsonObject:
        """JSON view: tensor arguments by shape/stride/offset/dtype, other values as they are."""
        return {"source": self.source, "label": self.label, "dtype": self.dtype,
                "args": [describe_value(a) for a in self.args],
                "kwargs": {k: describe_value(v) for k, v in self.kwargs.items()}}


def describe_value(v: object) -> JsonValue:
    """A sample argument as JSON: a tensor by shape, stride, offset and dtype; other values as they are."""
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "stride": list(v.stride()), "offset": v.storage_offset(),
                "dtype": str(v.dtype).removeprefix("torch.")}
    if isinstance(v, (list, tuple)):
        return [describe_value(x) for x in v]
    if isinstance(v, torch.dtype):
        return str(v)
    return v


def upcast(v: _V) -> _V:
    """``v`` with floating tensors (and dtype arguments) in float64: the reference's inputs."""
    if isinstance(v, torch.Tensor):
        return v.to(torch.float64) if v.is_floating_point() else v
    if isinstance(v, (list, tuple)):
        return type(v)(upcast(x) for x in v)
    if isinstance(v, torch.dtype) and v.is_floating_point:
        return torch.float64
    return v


def on_device(v: _V, device: str) -> _V:
    """``v`` with its tensors moved to ``device`` (CUDA kernels' samples; views become contiguous there)."""
    if device == "cpu":
        return v
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(on_device(x, device) for x in v)
    if isinstance(v, dict):
        return {k: on_device(x, device) for k, x in v.items()}
    return v


def schema_of(spec: KernelSpec) -> torch._C.FunctionSchema:
    """The ``FunctionSchema`` of the op a kernel implements."""
    if spec.is_aten:
        from .loading import aten_overload

        return aten_overload(spec)._schema
    return torch._C.parse_schema(spec.op)


# ---------------------------------------------------------------------------------------------- OpInfo


def _opinfos(spec: KernelSpec) -> list[OpInfo]:
    """The OpInfo entries of an ATen kernel's op (by ``opinfo`` name, else by ATen name)."""
    if not spec.is_aten and spec.opinfo is None:
        return []
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # noqa: BLE001 - missing expecttest etc.: no OpInfo samples, fuzzing still runs
        return []
    if spec.opinfo:
        return [o for o in op_db if o.name == spec.opinfo]
    short = spec.op_name.split("::")[1].split(".")[0]
    return [o for o in op_db if o.aten_name == short or o.name == short]


def _opinfo_samples(spec: KernelSpec, dtype: str) -> Iterator[Sample]:
    torch_dtype = _DTYPES[dtype]
    for info in _opinfos(spec):
        if torch_dtype not in info.supported_dtypes("cpu"):
            continue
        torch.manual_seed(0)
        label = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        for i, s in enumerate(info.sample_inputs("cpu", torch_dtype)):
            if i >= OPINFO_LIMIT:
                break
            if not isinstance(s.input, torch.Tensor):
                continue
            yield Sample("opinfo", f"{label}[{i}]", dtype, [s.input, *s.args], dict(s.kwargs))


# ---------------------------------------------------------------------------------------------- fuzzing


def _dims(spec: KernelSpec, schema: torch._C.FunctionSchema) -> dict[str, tuple[bool, list[str]]] | None:
    """tensor argument -> (has leading ``...``, named dims); None when the kernel cannot be fuzzed."""
    tensors = [a.name for a in schema.arguments if str(a.type) == "Tensor"]
    if spec.inputs:
        if set(tensors) - set(spec.inputs):
            return None
        raw = spec.inputs
    elif len(tensors) == 1:
        raw = {tensors[0]: "..."}
    else:
        return None
    out = {}
    # in the schema's argument order, not the manifest's key order (a manifest read back from the
    # database has its keys sorted): the same kernel gets the same samples on every path
    for name in sorted(raw, key=lambda n: tensors.index(n) if n in tensors else len(tensors)):
        text = raw[name]
        parts = [p for p in text.split(",") if p]
        out[name] = (bool(parts) and parts[0] == "...", [p for p in parts if p != "..."])
    return out


def _scalars(spec: KernelSpec, schema: torch._C.FunctionSchema) -> dict[str, object] | None:
    """The values of the schema's other arguments (declared, else left to their defaults); None when
    one without a default is not declared."""
    values: dict[str, object] = {}
    for a in schema.arguments:
        if str(a.type) == "Tensor":
            continue
        if a.name in spec.args:
            values[a.name] = spec.args[a.name]
        elif a.has_default_value():
            continue
        else:
            return None
    return values


class _Maker:
    """Tensors for one kernel's arguments from a seeded generator."""

    def __init__(self, dims: dict[str, tuple[bool, list[str]]], scalars: dict[str, object],
                 schema: torch._C.FunctionSchema, seed: int) -> None:
        self.dims, self.scalars, self.schema = dims, scalars, schema
        self.gen = torch.Generator().manual_seed(seed)

    def shape(self, name: str, batch: tuple[int, ...], size: int) -> tuple[int, ...]:
        lead, named = self.dims[name]
        return (*(batch if lead else ()), *([size] * len(named)))

    def values(self, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=self.gen, dtype=torch.float64) * scale).to(dtype)

    def call(self, tensors: dict[str, torch.Tensor]) -> tuple[list[object], dict[str, object]]:
        """The kernel's arguments and keyword arguments in its schema's order."""
        args: list[object] = []
        kwargs: dict[str, object] = {}
        for a in self.schema.arguments:
            value = tensors.get(a.name, self.scalars.get(a.name))
            if a.name not in tensors and a.name not in self.scalars:
                continue
            if a.kwarg_only:
                kwargs[a.name] = value
            else:
                args.append(value)
        return args, kwargs


def _layout(t: torch.Tensor, kind: str, lead: bool) -> torch.Tensor | None:
    """``t``'s values in another memory layout (same logical shape), or None when it does not apply."""
    if kind == "noncontiguous" and t.dim() >= 1:
        wide = torch.zeros((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if kind == "offset":
        flat = torch.zeros(t.numel() + 3, dtype=t.dtype, device=t.device)
        flat[3:] = t.reshape(-1)
        return flat.as_strided(t.shape, t.contiguous().stride(), 3)
    if kind == "broadcast" and lead and t.dim() >= 2:
        return t[:1].expand(t.shape)
    return None


def _special(t: torch.Tensor, kind: str) -> torch.Tensor:
    info = torch.finfo(t.dtype)
    out = t.clone(memory_format=torch.contiguous_format)  # a strided input's clone keeps its strides
    flat = out.view(-1)
    if kind == "nan":
        flat[:: max(1, flat.numel() // 3)] = float("nan")
    elif kind == "inf":
        flat[0], flat[-1] = float("inf"), float("-inf")
    elif kind == "subnormal":
        flat[:] = flat.sign() * info.tiny * 0.25
    elif kind == "large":
        flat[:] = flat * (info.max / 8)
    return out


#: What the fuzzing varies, shared with the backend conformance sweep (``debug_framework.conformance``).
FUZZ_SHAPES = _SHAPES
LAYOUTS = ("noncontiguous", "transposed", "offset", "broadcast")
SPECIALS = ("nan", "inf", "subnormal", "large")
MAGNITUDES = (1e-4, 1e-2, 1e3)
relayout = _layout
with_special = _special


def _fuzz_samples(spec: KernelSpec, dtype: str, seed: int, model_shapes: list[dict[str, list[int]]]) -> Iterator[Sample]:
    schema = schema_of(spec)
    dims, scalars = _dims(spec, schema), _scalars(spec, schema)
    if dims is None or scalars is None:
        return
    mk = _Maker(dims, scalars, schema, seed)
    td = _DTYPES[dtype]

    def fresh(batch: tuple[int, ...], size: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
        return {n: mk.values(mk.shape(n, batch, size), td, scale) for n in dims}

    for batch, size in _SHAPES:
        yield Sample("shape", f"batch {batch} size {size}", dtype, *mk.call(fresh(batch, size)))
    batch, size = _BASE
    for kind in LAYOUTS:
        tensors = fresh(batch, size)
        laid = {n: _layout(t, kind, dims[n][0]) for n, t in tensors.items()}
        if any(v is not None for v in laid.values()):
            yield Sample("stride", kind, dtype, *mk.call({n: laid[n] if laid[n] is not None else t
                                                           for n, t in tensors.items()}))
    for kind in SPECIALS:
        first = next(iter(dims))
        tensors = fresh(batch, size)
        tensors[first] = _special(tensors[first], kind)
        yield Sample("special", f"{kind} in {first}", dtype, *mk.call(tensors))
    for scale in MAGNITUDES:
        yield Sample("magnitude", f"values x {scale:g}", dtype, *mk.call(fresh(batch, size, scale)))
    for i, shapes in enumerate(model_shapes):
        if set(shapes) >= set(dims):
            tensors = {n: mk.values(tuple(shapes[n]), td) for n in dims}
            yield Sample("model", f"model call {i}: " + ", ".join(f"{n}{tuple(s)}" for n, s in shapes.items()), dtype,
                         *mk.call(tensors))


def make_samples(spec: KernelSpec, *, seed: int = 0, model_shapes: list[dict[str, list[int]]] | None = None,
                 opinfo: bool = True) -> list[Sample]:
    """Every sample of a kernel, for each of its dtypes, in a fixed order (same seed, same list)."""
    out: list[Sample] = []
    for i, dtype in enumerate(spec.dtypes):
        if opinfo:
            out.extend(_opinfo_samples(spec, dtype))
        out.extend(_fuzz_samples(spec, dtype, seed + i, list(model_shapes or [])))
    return out
