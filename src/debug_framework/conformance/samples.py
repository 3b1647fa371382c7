"""The samples of one operator in one dtype: every OpInfo sample (none left out), then the plugin
sweep's fuzzing applied to the operator's first floating input.

The fuzzed samples start from the first OpInfo sample whose input is a floating tensor with
elements, and replace that input by the same values in another memory layout (non-contiguous,
transposed, at a storage offset, broadcast), by values with NaN, infinities, subnormals or values
near the dtype's maximum, or scaled by 1e-4, 1e-2 and 1e3; an elementwise unary operator also gets
fresh inputs of the plugin sweep's shapes (empty, scalar, odd lengths, 4099 elements). Every sample
is made from a seed, so a worker that restarts makes exactly the same list again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..plugins.samples import FUZZ_SHAPES, LAYOUTS, MAGNITUDES, SPECIALS, Sample, relayout, with_special
from .ops import DTYPES

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

__all__ = ["op_samples", "opinfo_samples", "fuzz_samples"]


def opinfo_samples(info: OpInfo, dtype: str, device: str = "cpu") -> list[Sample]:
    """Every sample OpInfo makes for the operator in ``dtype`` (its RNG seeded, so the list repeats)."""
    torch.manual_seed(0)
    out = []
    for i, s in enumerate(info.sample_inputs(device, DTYPES[dtype])):
        out.append(Sample("opinfo", f"opinfo[{i}]", dtype, [s.input, *s.args], dict(s.kwargs)))
    return out


def _seed_input(samples: list[Sample]) -> Sample | None:
    for s in samples:
        first = s.args[0] if s.args else None
        if (isinstance(first, torch.Tensor) and first.layout == torch.strided and first.is_floating_point()
                and first.numel() > 1):  # a sparse input has no memory layout of its own to vary
            return s
    return None


def fuzz_samples(info: OpInfo, dtype: str, base: list[Sample], seed: int = 0) -> list[Sample]:
    """Layouts, special values and magnitudes of the first floating input of ``base``'s first
    usable sample; fresh shapes for an elementwise unary operator."""
    seed_sample = _seed_input(base)
    if seed_sample is None:
        return []
    x = seed_sample.args[0]
    rest, kwargs = seed_sample.args[1:], seed_sample.kwargs
    out: list[Sample] = []

    def add(source: str, label: str, value: torch.Tensor) -> None:
        out.append(Sample(source, label, dtype, [value, *rest], dict(kwargs)))

    for kind in LAYOUTS:
        laid = relayout(x, kind, True)
        if laid is not None:
            add("stride", kind, laid)
    for kind in SPECIALS:
        add("special", kind, with_special(x, kind))
    for scale in MAGNITUDES:
        add("magnitude", f"values x {scale:g}", (x.to(torch.float64) * scale).to(x.dtype))
    if type(info).__name__ == "UnaryUfuncInfo" and not rest:
        gen = torch.Generator().manual_seed(seed)
        for shape, size in FUZZ_SHAPES:
            full = (*shape, size)
            value = torch.randn(full, generator=gen, dtype=torch.float64).to(device=x.device, dtype=DTYPES[dtype])
            add("shape", f"shape {tuple(full)}", value)
    return out


def op_samples(info: OpInfo, dtype: str, *, fuzz: bool = True, seed: int = 0, device: str = "cpu") -> list[Sample]:
    """The operator's samples in ``dtype``: OpInfo's, then the fuzzed ones (with ``fuzz``)."""
    base = opinfo_samples(info, dtype, device)
    return base + (fuzz_samples(info, dtype, base, seed) if fuzz else [])
