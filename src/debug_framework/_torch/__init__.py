"""The only place in the project that touches private PyTorch APIs (both packages use it).

One module per private package, each checking the torch version on import:

- :mod:`.dynamo`    - ``torch._dynamo`` (explain, guards, recompilation hooks, reset)
- :mod:`.functorch` - ``torch._functorch`` / ``torch._decomp`` / fake tensors (AOTAutograd)
- :mod:`.inductor`  - ``torch._inductor`` (inner compiler, trace/debug config, decompositions)

To support a new torch release: check those three modules against its source, then add its
range to :data:`SUPPORTED_TORCH_RANGES`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeAlias, Union

import torch

from ..errors import UnsupportedTorchVersionError

__all__ = ["SUPPORTED_TORCH_RANGES", "parse_version", "check_torch_version", "GraphInput", "CompiledFn",
           "Decompositions"]

#: One input of an FX graph: a tensor, or a (symbolic) size or scalar.
GraphInput: TypeAlias = Union[torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool, None]
#: A compiled graph or frame: called with the graph's inputs, returns its outputs (a boxed
#: callable takes them as one list).
CompiledFn: TypeAlias = Callable[..., object]
#: A decomposition table: an ATen operator (overload or packet) -> its Python decomposition.
Decompositions: TypeAlias = dict[torch._ops.OperatorBase, Callable[..., object]]

#: Half-open ranges ``[low, high)`` of (major, minor) torch versions these modules were checked against.
SUPPORTED_TORCH_RANGES: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (((2, 13), (2, 14)),)


def parse_version(version: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    if not m:
        raise UnsupportedTorchVersionError(f"cannot parse torch version {version!r}", torch_version=version)
    return int(m.group(1)), int(m.group(2))


def check_torch_version(version: str | None = None) -> tuple[int, int]:
    """Raise :class:`UnsupportedTorchVersionError` unless ``version`` (default: installed torch) is supported."""
    version = version or torch.__version__
    mm = parse_version(version)
    if any(lo <= mm < hi for lo, hi in SUPPORTED_TORCH_RANGES):
        return mm
    ranges = ", ".join(f">={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}" for lo, hi in SUPPORTED_TORCH_RANGES)
    raise UnsupportedTorchVersionError(
        f"torch {version} is not supported by the private-API layer (debug_framework._torch) (supported: {ranges})",
        torch_version=version,
    )
