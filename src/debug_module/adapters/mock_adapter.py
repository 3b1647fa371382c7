"""The mock accelerator as an adapter: MOCK_* style limits, executes the ATen graph as is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch.fx

from ..config import DEFAULT_MOCK_DENYLIST, MockConfig
from .base import AcceleratorAdapter, AcceleratorCapabilities

__all__ = ["MockAcceleratorAdapter"]


class MockAcceleratorAdapter(AcceleratorAdapter):
    """Reference adapter. Its "device" runs the checked ATen graph eagerly on the host."""

    name = "mock_accel_adapter"

    def __init__(self, config: MockConfig | None = None, *, artifact_root: str | Path | None = None) -> None:
        self.config = config or MockConfig()
        self.strict = self.config.strict
        self.artifact_root = artifact_root
        self.compiled_graphs: list[tuple[str, int]] = []

    def capabilities(self) -> AcceleratorCapabilities:
        return AcceleratorCapabilities(
            unsupported_ops=frozenset(DEFAULT_MOCK_DENYLIST),
            memory_limit=self.config.max_memory,
            alignment=self.config.alignment,
            requires_contiguous=True,
            channels_last=False,
        )

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object], kind: str) -> Callable[..., object]:
        self.compiled_graphs.append((kind, len(gm.graph.nodes)))
        return gm.forward
