"""The mock accelerator backend in eager validation mode.

Each Dynamo graph goes through AOTAutograd once; the forward/backward ATen graphs are checked
against the mock accelerator's constraints and then run as they are (eagerly) - nothing is lowered.

``mock_backend`` (also the ``mock_accel`` torch.compile backend) reads ``MOCK_STRICT``,
``MOCK_ALIGNMENT`` and ``MOCK_MAX_MEMORY`` each time it compiles a graph (see
:func:`debug_module.config.read_mock_env`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..config import MockConfig, read_mock_env
from ..constraints import Constraint, GraphReport, Violation
from ..pipeline import CompilePipeline

__all__ = ["MockBackend", "mock_backend", "make_mock_backend"]


class MockBackend:
    """A torch.compile backend validating ATen graphs against mock-accelerator constraints.

    Args:
        strict: raise on violations (``None``: from ``MOCK_STRICT``).
        constraints: the constraints (``None``: the mock defaults built from the ``MOCK_*`` settings;
            ``[]``: none).
        artifact_root: if given, each compiled graph's artifacts go to a run directory there.
        from_env: read ``MOCK_*`` at every compile (the module-level :data:`mock_backend` does).
    """

    def __init__(self, *, strict: bool | None = None, constraints: Sequence[Constraint | Callable[..., object]] | None = None,
                 artifact_root: str | Path | None = None, from_env: bool = True) -> None:
        self.strict = strict
        self.constraints = None if constraints is None else list(constraints)
        self.artifact_root = artifact_root
        self.from_env = from_env
        self.pipelines: list[CompilePipeline] = []

    def _pipeline(self) -> CompilePipeline:
        cfg = read_mock_env() if self.from_env else MockConfig()
        strict = cfg.strict if self.strict is None else self.strict
        constraints = cfg.constraints() if self.constraints is None else self.constraints
        return CompilePipeline(constraints=constraints, strict=strict, lowering="eager",
                               artifact_root=self.artifact_root, decompositions="inductor", name="mock_accel")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable[..., object]:
        pipeline = self._pipeline()
        self.pipelines.append(pipeline)
        return pipeline(gm, example_inputs)

    @property
    def reports(self) -> list[GraphReport]:
        return [r for p in self.pipelines for r in p.reports]

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.reports for v in r.violations]

    def clear(self) -> None:
        self.pipelines.clear()


def make_mock_backend(*, strict: bool | None = None, constraints: Sequence[Constraint | Callable[..., object]] | None = None,
                      artifact_root: str | Path | None = None, from_env: bool = False) -> MockBackend:
    """A fresh mock backend with its own records (settings not given come from ``MockConfig`` defaults,
    or from the ``MOCK_*`` variables with ``from_env=True``)."""
    return MockBackend(strict=strict, constraints=constraints, artifact_root=artifact_root, from_env=from_env)


#: The ``mock_accel`` backend: settings from ``MOCK_*`` at each compile; records in ``.reports``.
mock_backend = MockBackend(from_env=True)
