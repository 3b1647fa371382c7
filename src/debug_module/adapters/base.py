"""The interface an accelerator team implements to plug its compiler behind torch.compile.

An adapter declares what the device can do (:class:`AcceleratorCapabilities`) and how to compile one
ATen-level FX graph (:meth:`AcceleratorAdapter.compile`). The framework does the rest: Dynamo
capture, AOTAutograd (forward and backward graphs), constraint checks derived from the capabilities,
violation reports, coverage, and artifacts. An adapter is itself a torch.compile backend:

    compiled = torch.compile(model, backend=MyAdapter())
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx

from ..constraints import (
    DEFAULT_ALLOWED_DTYPES,
    Constraint,
    DtypeConstraint,
    DynamicShapeConstraint,
    LayoutConstraint,
    MaxRankConstraint,
    MemoryConstraint,
    OpAllowlistConstraint,
    OpDenylistConstraint,
    ShapeConstraint,
)
from ..pipeline import CompilePipeline

__all__ = ["AcceleratorCapabilities", "AcceleratorAdapter"]


@dataclass(frozen=True)
class AcceleratorCapabilities:
    """What a device supports. Each field becomes a constraint (see :meth:`to_constraints`).

    ``supported_ops=None`` means "every op not in ``unsupported_ops``"; memory limits are bytes
    (``None``: unlimited); ``alignment`` applies to ``alignment_dims`` (``"all"``, ``"last"`` or indices).
    """

    dtypes: frozenset[torch.dtype] = DEFAULT_ALLOWED_DTYPES
    supported_ops: frozenset[str] | None = None
    unsupported_ops: frozenset[str] = frozenset()
    memory_limit: int | None = None
    peak_memory_limit: int | None = None
    alignment: int = 1
    alignment_dims: str | tuple[int, ...] = "all"
    max_rank: int | None = None
    dynamic_shapes: bool = True
    requires_contiguous: bool = False
    channels_last: bool = True
    extra_constraints: tuple[Constraint | Callable[..., object], ...] = field(default_factory=tuple)

    def to_constraints(self) -> list[Constraint | Callable[..., object]]:
        cons: list[Constraint | Callable[..., object]] = [DtypeConstraint(self.dtypes)]
        if self.supported_ops is not None:
            cons.append(OpAllowlistConstraint(self.supported_ops))
        if self.unsupported_ops:
            cons.append(OpDenylistConstraint(self.unsupported_ops))
        if self.memory_limit is not None or self.peak_memory_limit is not None:
            cons.append(MemoryConstraint(self.memory_limit, self.peak_memory_limit))
        if self.alignment > 1:
            cons.append(ShapeConstraint(self.alignment, self.alignment_dims))
        if self.max_rank is not None:
            cons.append(MaxRankConstraint(self.max_rank))
        if not self.dynamic_shapes:
            cons.append(DynamicShapeConstraint(allow_dynamic=False))
        if self.requires_contiguous:
            cons.append(LayoutConstraint(require_contiguous=True, allow_channels_last=self.channels_last))
        cons.extend(self.extra_constraints)
        return cons


class AcceleratorAdapter(ABC):
    """Base class for accelerator adapters.

    Implement :meth:`capabilities` and :meth:`compile`. Optional knobs: ``name``, ``strict``
    (raise on violations, default ``True``), ``artifact_root`` (write a run directory), and
    ``decompositions`` (``"inductor"`` default, ``"core_aten"``, or ``None``).
    """

    name: str = "accelerator"
    strict: bool = True
    artifact_root: str | Path | None = None
    decompositions: str | None = "inductor"

    @abstractmethod
    def capabilities(self) -> AcceleratorCapabilities:
        """What the device supports."""

    @abstractmethod
    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object], kind: str) -> Callable[..., object]:
        """Compile one ATen graph (``kind``: ``forward``, ``backward`` or ``inference``).

        ``gm``'s nodes are ATen ops with FakeTensor metadata in ``node.meta["val"]``;
        ``example_inputs`` are fake tensors. Return a callable taking the graph's inputs positionally
        and returning what ``gm`` returns (a tuple/list). Called only for graphs that passed the
        constraints (or in warn mode).
        """

    # Names from the work plan, derived from capabilities().
    def get_supported_dtypes(self) -> frozenset[torch.dtype]:
        return self.capabilities().dtypes

    def get_supported_ops(self) -> frozenset[str] | None:
        return self.capabilities().supported_ops

    def get_memory_limit(self) -> int | None:
        return self.capabilities().memory_limit

    def get_alignment(self) -> int:
        return self.capabilities().alignment

    def constraints(self) -> list[Constraint | Callable[..., object]]:
        return self.capabilities().to_constraints()

    def backend(self) -> CompilePipeline:
        """A fresh torch.compile backend for this adapter (one run / set of records per backend)."""
        from debug_framework._torch import functorch

        def lower(gm: torch.fx.GraphModule, inputs: Sequence[object], kind: str) -> Callable[..., object]:
            return functorch.make_boxed_func(self.compile(gm, inputs, kind))

        pipeline = CompilePipeline(constraints=self.constraints(), strict=self.strict, lowering=lower,
                                   artifact_root=self.artifact_root, decompositions=self.decompositions,
                                   name=self.name)
        self.last_backend = pipeline
        return pipeline

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable[..., object]:
        """Use the adapter directly as a torch.compile backend (records land on ``self.last_backend``)."""
        return self.backend()(gm, example_inputs)
