"""The strict-mode repro writer: minify the violating ATen graph, save a verified repro in the run directory.

Installed by default through :mod:`debug_module.repro` (imported lazily at the first strict-mode
violation); ``set_repro_writer(None)`` turns it off. It reduces the graph that was *checked* (the ATen
graph after AOTAutograd and decompositions), so the repro fails the same constraint at the same op.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from ..constraints.base import Violation
from .minifier import Minifier
from .signatures import ConstraintSignature

if TYPE_CHECKING:
    from ..artifacts import RunDirectory
    from ..constraints.base import Constraint

__all__ = ["write_strict_repro", "StrictReproRequest", "STRICT_MAX_CALLS", "STRICT_MAX_SECONDS"]

log = logging.getLogger("debug_module.minifier")

#: Budget of one strict-mode minification (it runs inside torch.compile, before the error is raised).
STRICT_MAX_CALLS = 400
STRICT_MAX_SECONDS = 60.0


class StrictReproRequest(Protocol):
    """What this writer reads of a :class:`debug_module.repro.ReproRequest` (described here, not
    imported: the plug point in :mod:`debug_module.repro` depends on the minifier, not the reverse)."""

    @property
    def example_inputs(self) -> Sequence[object]: ...
    @property
    def aten_graph(self) -> torch.fx.GraphModule: ...
    @property
    def graph_name(self) -> str: ...
    @property
    def violations(self) -> list[Violation]: ...
    @property
    def constraints(self) -> list[Constraint]: ...
    @property
    def run_dir(self) -> Path | None: ...
    @property
    def run(self) -> RunDirectory | None: ...


def _matching_inputs(gm: torch.fx.GraphModule, inputs: Sequence[object]) -> list[object] | None:
    """The real example inputs when they line up with the ATen graph's placeholders, else ``None``."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        return None
    from debug_framework._torch.functorch import is_fake_tensor

    for p, x in zip(placeholders, inputs):
        if is_fake_tensor(x):
            return None
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor) != isinstance(x, torch.Tensor):
            return None
        if isinstance(x, torch.Tensor):
            try:
                if tuple(int(d) for d in val.shape) != tuple(x.shape) or val.dtype != x.dtype:
                    return None
            except Exception:  # symbolic dims
                return None
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs]


def write_strict_repro(request: StrictReproRequest) -> Path | None:
    """Minify ``request.aten_graph`` to the first violation and save ``<run>/repros/<graph>/``.

    Returns the verified ``repro.py`` path, or ``None`` without a run directory (nowhere to save) or when no
    reduced graph reproduced in a fresh process (the error's message then says no repro was written)."""
    if request.run_dir is None or not request.violations:
        return None
    from debug_framework._torch.functorch import outside_compile_modes

    with outside_compile_modes():
        return _write(request)


def _write(request: StrictReproRequest) -> Path | None:
    v = request.violations[0]
    signature = ConstraintSignature.from_violation(v, request.constraints)
    rel = f"repros/{request.graph_name}"
    out = Path(request.run_dir) / rel
    minifier = Minifier(request.aten_graph, _matching_inputs(request.aten_graph, request.example_inputs), signature,
                        max_calls=STRICT_MAX_CALLS, max_seconds=STRICT_MAX_SECONDS, progress=False,
                        output_dir=out, title=f"Strict-mode repro of {request.graph_name}: {v.describe()}")
    result = minifier.minify()
    (out / "minify.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
    if request.run is not None:
        request.run.record_tree(rel, "repro", request.graph_name)
    log.info("%s: repro %s (%s)", request.graph_name, out, result.summary())
    if not result.verified:
        log.warning("%s: the reduced graph did not reproduce in a fresh process: %s", request.graph_name,
                    "; ".join(result.notes))
        return None
    return result.repro_path
