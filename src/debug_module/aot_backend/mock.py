"""AOTAutograd + Inductor backend with constraint checks and artifact capture.

    backend = aot_mock_backend(strict=False, constraints=[ShapeConstraint(alignment=8)],
                               artifact_root="debug_artifacts")
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    backend.run_dir      # this run's directory (manifest.json, fx_graphs/, aot_graphs/, inductor_ir/ ...)
    backend.reports      # one GraphReport per ATen graph (forward, backward, inference)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..artifacts import DEFAULT_ARTIFACT_ROOT
from ..config import MockConfig, read_mock_env
from ..constraints import Constraint
from ..pipeline import CompilePipeline

__all__ = ["aot_mock_backend", "aot_mock_backend_default", "AotMockBackend"]

AotMockBackend = CompilePipeline


def aot_mock_backend(
    strict: bool = True,
    constraints: Sequence[Constraint | Callable[..., object]] | None = None,
    *,
    artifact_root: str | Path = DEFAULT_ARTIFACT_ROOT,
    svg: bool = False,
) -> CompilePipeline:
    """A backend that captures the pre-AOT FX graph, runs AOTAutograd once, checks each forward/backward
    ATen graph, and compiles it with Inductor's inner compiler, capturing Inductor's IR (pre/post fusion)
    and generated kernels into a fresh run directory under ``artifact_root``.

    ``constraints=None`` uses the mock accelerator defaults (:meth:`MockConfig.constraints`); ``[]`` none.
    One backend object = one run directory (created at its first graph); make a new backend for a new run.
    """
    cons = MockConfig().constraints() if constraints is None else list(constraints)
    return CompilePipeline(constraints=cons, strict=strict, lowering="inductor", artifact_root=artifact_root,
                           decompositions="inductor", svg=svg, name="aot_mock_accel")


def aot_mock_backend_default(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable[..., object]:
    """The ``aot_mock_accel`` named backend: strictness and constraints from ``MOCK_*``, artifacts under
    ``./debug_artifacts``; each compiled Dynamo graph gets its own run directory."""
    cfg = read_mock_env()
    return aot_mock_backend(strict=cfg.strict, constraints=cfg.constraints())(gm, example_inputs)
