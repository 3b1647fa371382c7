"""Where a repro writer (the minifier) plugs into strict-mode constraint failures.

When strict mode finds violations, the backend calls :func:`write_repro` with a
:class:`ReproRequest` *before* raising :class:`~debug_module.errors.ConstraintViolationError`.
No writer is installed by default, so nothing is written and the error says so; the minifier
(issue 7) installs one with :func:`set_repro_writer`. Writers should save under
``request.run_dir / "repros"`` and return the script's path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.fx

from .constraints.base import Violation

__all__ = ["ReproRequest", "ReproWriter", "set_repro_writer", "get_repro_writer", "write_repro"]

log = logging.getLogger(__name__)


@dataclass
class ReproRequest:
    """Everything a repro writer needs about one failing graph.

    ``fx_graph`` and ``example_inputs`` are the pre-AOT Dynamo graph and its (real) example
    inputs - repros are generated from pre-AOT graphs; ``aten_graph`` is the graph that was
    checked (``graph_name`` says which: ``graph_000_forward`` ...); ``constraints`` are the
    Constraint objects that found ``violations``.
    """

    fx_graph: torch.fx.GraphModule
    example_inputs: Sequence[Any]
    aten_graph: torch.fx.GraphModule
    graph_name: str
    violations: list[Violation]
    constraints: list[Any]
    run_dir: Path | None


ReproWriter = Callable[[ReproRequest], "Path | None"]

_writer: ReproWriter | None = None


def set_repro_writer(writer: ReproWriter | None) -> ReproWriter | None:
    """Install (or with ``None`` remove) the repro writer; returns the previous one."""
    global _writer
    previous, _writer = _writer, writer
    return previous


def get_repro_writer() -> ReproWriter | None:
    return _writer


def write_repro(request: ReproRequest) -> Path | None:
    """Call the installed writer; ``None`` when there is none. A failing writer is logged, not raised,
    so the constraint error itself still reaches the user."""
    if _writer is None:
        return None
    try:
        return _writer(request)
    except Exception:
        log.exception("repro writer failed for %s", request.graph_name)
        return None
