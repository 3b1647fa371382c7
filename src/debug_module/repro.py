"""Where a repro writer (the minifier) plugs into strict-mode constraint failures.

When strict mode finds violations, the backend calls :func:`write_repro` with a
:class:`ReproRequest` *before* raising :class:`~debug_module.errors.ConstraintViolationError`.
By default the minifier's writer (:func:`debug_module.minifier.write_strict_repro`, imported lazily
at the first violation) reduces the checked graph and saves a verified repro under
``request.run_dir / "repros"``; :func:`set_repro_writer` installs another one, ``None`` turns it off.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch.fx

from .constraints.base import Constraint, Violation

if TYPE_CHECKING:
    from .artifacts import RunDirectory

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
    example_inputs: Sequence[object]
    aten_graph: torch.fx.GraphModule
    graph_name: str
    violations: list[Violation]
    constraints: list[Constraint]
    run_dir: Path | None
    #: the run's :class:`~debug_module.artifacts.RunDirectory` (to record repro files in its manifest)
    run: RunDirectory | None = None


ReproWriter = Callable[[ReproRequest], "Path | None"]


class _Default(enum.Enum):
    """The writer installed until :func:`set_repro_writer` is called (a typed sentinel)."""

    MINIFIER = "the minifier's writer, imported on first use"


_writer: ReproWriter | None | _Default = _Default.MINIFIER


def set_repro_writer(writer: ReproWriter | None) -> ReproWriter | None:
    """Install (or with ``None`` remove) the repro writer; returns the previous one."""
    global _writer
    previous = get_repro_writer()
    _writer = writer
    return previous


def get_repro_writer() -> ReproWriter | None:
    """The installed repro writer (by default the minifier's), ``None`` when turned off."""
    if _writer is _Default.MINIFIER:
        from .minifier.strict import write_strict_repro

        return write_strict_repro
    return _writer


def write_repro(request: ReproRequest) -> Path | None:
    """Call the installed writer; ``None`` when there is none. A failing writer is logged, not raised,
    so the constraint error itself still reaches the user."""
    try:
        writer = get_repro_writer()
        if writer is None:
            return None
        return writer(request)
    except Exception:
        log.exception("repro writer failed for %s", request.graph_name)
        return None
