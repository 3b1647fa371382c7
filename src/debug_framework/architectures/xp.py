"""The array namespaces the models are written over: NumPy, ``torch`` (imported on first use) and
those an engine registers (:func:`register_namespace`: an engine whose arrays the reference models
run over registers its namespace under its array types' module prefix).

The models use array methods the libraries share (``@``, ``.T`` of 2-D weights, ``.reshape``,
``.mean`` and ``.sum`` with ``axis``/``keepdims``, indexing) and, for everything else, an
:class:`ArrayNamespace`: the few functions below, looked up from the arrays themselves with
:func:`array_namespace` (as the array-API standard's ``x.__array_namespace__()``). Where the
libraries differ (erf, axis permutations, the maximum over an axis, the dtype's lowest value,
boolean masks, moving host data in) the difference is written here and nowhere else. The torch
namespace runs the same models in any torch dtype (bfloat16 and float16 included): the validation
engine's calibration runs them so (:mod:`debug_framework.backends.torch_reference`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import numpy as np

from ..errors import BackendInitializationError

__all__ = ["Array", "DType", "ArrayNamespace", "NUMPY", "torch_namespace", "array_namespace", "register_namespace"]


class Array(Protocol):
    """An array of one of the namespaces (``np.ndarray``, ``torch.Tensor``, a registered engine's):
    what the models use of it directly; everything else goes through its :class:`ArrayNamespace`."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __matmul__(self, other: Array) -> Array: ...

    def reshape(self, *shape: int) -> Array: ...


#: a dtype of one of the namespaces (``np.dtype``, ``torch.dtype``, a registered engine's): each
#: namespace reads its own (:attr:`ArrayNamespace.dtype`).
DType: TypeAlias = object

Unary = Callable[[Array], Array]


@dataclass(frozen=True, slots=True)
class ArrayNamespace:
    """The array functions the models call, for one array library."""

    name: str
    #: ``dtype(d)``: a dtype or its name (``"float32"``) as this library's dtype.
    dtype: Callable[[object], DType]
    sqrt: Unary
    exp: Unary
    tanh: Unary
    #: the error function, in the argument's dtype.
    erf: Unary
    maximum: Callable[[Array, float], Array]
    where: Callable[[Array, Array, Array], Array]
    repeat: Callable[..., Array]  # (x, repeats, axis=...)
    concatenate: Callable[..., Array]  # (arrays, axis=...)
    zeros_like: Unary
    #: ``lowest(dtype)``: the most negative finite value, as a scalar of that dtype.
    lowest: Callable[[DType], Array]
    #: ``lower_triangle(t, k=0)``: the boolean ``[T, T]`` mask ``j <= i + k``.
    lower_triangle: Callable[..., Array]
    #: ``host_dtype(dtype)``: the NumPy dtype host data is read in before :attr:`from_host`.
    host_dtype: Callable[[DType], np.dtype]
    #: ``from_host(x, dtype)``: a NumPy array as an array of this namespace in ``dtype``.
    from_host: Callable[[np.ndarray, DType], Array]
    #: ``permute(x, axes)``: the axes of ``x`` reordered (NumPy's ``transpose(x, axes)``).
    permute: Callable[[Array, tuple[int, ...]], Array]
    #: ``amax(x, axis)``: the maximum over ``axis``, the axis kept (size 1).
    amax: Callable[[Array, int], Array]
    #: ``sort(x)``: the values of ``x`` in ascending order along the last axis.
    sort: Unary


try:  # SciPy's erf is the C library's, vectorised; math.erf is the same function, one element at a time.
    from scipy.special import erf as _scipy_erf
except ImportError:  # pragma: no cover - SciPy is optional
    _scipy_erf = np.frompyfunc(math.erf, 1, 1)


def _numpy_erf(x: np.ndarray) -> np.ndarray:
    """The error function, exact to the C library's precision, in ``x``'s dtype."""
    return np.asarray(_scipy_erf(x), dtype=x.dtype)


NUMPY = ArrayNamespace(
    name="numpy",
    dtype=np.dtype,
    sqrt=np.sqrt,
    exp=np.exp,
    tanh=np.tanh,
    erf=_numpy_erf,
    maximum=np.maximum,
    where=np.where,
    repeat=np.repeat,
    concatenate=np.concatenate,
    zeros_like=np.zeros_like,
    lowest=lambda dtype: np.finfo(dtype).min,
    lower_triangle=lambda t, k=0: np.tril(np.ones((t, t), dtype=bool), k),
    host_dtype=np.dtype,
    from_host=lambda x, dtype: np.asarray(x, dtype),
    permute=np.transpose,
    amax=lambda x, axis: np.max(x, axis=axis, keepdims=True),
    sort=lambda x: np.sort(x, axis=-1),
)

_TORCH: list[ArrayNamespace] = []


def _torch_dtype(d: object) -> DType:
    """A torch dtype from a torch dtype, a name (``"bfloat16"``, ``"torch.float32"``) or a NumPy dtype."""
    import torch

    if isinstance(d, torch.dtype):
        return d
    name = d if isinstance(d, str) else np.dtype(d).name  # type: ignore[call-overload]
    found = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise BackendInitializationError(f"{d!r} is not a torch dtype")
    return found


def _torch_host_dtype(dtype: DType) -> np.dtype:
    """float32 for a float32 model (read once, exactly as rounding through float64 would give),
    else float64 (rounded once to a half precision from there)."""
    return np.dtype(np.float32) if _torch_dtype(dtype) == _torch_dtype("float32") else np.dtype(np.float64)


def torch_namespace() -> ArrayNamespace:
    """The ``torch`` namespace (imports torch; built once). Host data goes in as float32 for a float32
    model, else as float64, and is rounded once to the compute dtype; every step then runs in torch's kernels of that dtype."""
    if not _TORCH:
        import torch

        _TORCH.append(ArrayNamespace(
            name="torch",
            dtype=_torch_dtype,
            sqrt=torch.sqrt,
            exp=torch.exp,
            tanh=torch.tanh,
            erf=torch.erf,
            maximum=torch.clamp_min,
            where=torch.where,
            repeat=lambda x, repeats, axis: torch.repeat_interleave(x, repeats, dim=axis),
            concatenate=lambda arrays, axis: torch.cat(list(arrays), dim=axis),
            zeros_like=torch.zeros_like,
            lowest=lambda dtype: torch.tensor(torch.finfo(dtype).min, dtype=dtype),
            lower_triangle=lambda t, k=0: torch.tril(torch.ones((t, t), dtype=torch.bool), diagonal=k),
            host_dtype=_torch_host_dtype,
            from_host=lambda x, dtype: torch.from_numpy(np.ascontiguousarray(x)).to(dtype),
            permute=torch.permute,
            amax=lambda x, axis: torch.amax(x, dim=axis, keepdim=True),
            sort=lambda x: torch.sort(x, dim=-1).values,
        ))
    return _TORCH[0]


_BY_TYPE: dict[type, ArrayNamespace] = {np.ndarray: NUMPY}

#: array type module prefix -> the loader of its namespace (``torch`` built in; engines add theirs).
_BY_PREFIX: dict[str, Callable[[], ArrayNamespace]] = {"torch": torch_namespace}


def register_namespace(module_prefix: str, loader: Callable[[], ArrayNamespace]) -> None:
    """Let the models run over the arrays whose type is defined in a module starting with
    ``module_prefix`` (``"torch"``: ``torch.Tensor``): :func:`array_namespace` then returns
    ``loader()`` for them (called on the first such array; it may import its library then)."""
    _BY_PREFIX[module_prefix] = loader
    for kind in [k for k in _BY_TYPE if k.__module__.startswith(module_prefix)]:
        del _BY_TYPE[kind]  # a namespace registered again replaces the one found before


def _registered(kind: type) -> ArrayNamespace | None:
    """The namespace registered for ``kind``'s module (the longest matching prefix), None if none is."""
    module = kind.__module__
    matches = [p for p in _BY_PREFIX if module == p or module.startswith(p + ".")]
    return _BY_PREFIX[max(matches, key=len)]() if matches else None


def array_namespace(x: Array) -> ArrayNamespace:
    """The namespace of an array (NumPy arrays and scalars, torch tensors, a registered engine's arrays)."""
    kind = type(x)
    found = _BY_TYPE.get(kind)
    if found is None:
        found = NUMPY if issubclass(kind, np.generic) else _registered(kind)
        if found is None:
            raise BackendInitializationError(
                f"no array namespace for {kind.__module__}.{kind.__qualname__}",
                hint="the reference models take NumPy or torch arrays, or those of a namespace registered "
                     "with debug_framework.architectures.xp.register_namespace")
        _BY_TYPE[kind] = found
    return found
