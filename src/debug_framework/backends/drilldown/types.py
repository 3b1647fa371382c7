"""What a drill-down found inside one layer: an operator table and the culprit.

A drill-down takes one layer that introduces error (or holds the first divergence), captures the
operators the alternative runs inside it, and judges each operator on the reference's inputs *to
that operator*, so the operator that introduces error is named rather than the ones that carry it.
How the operators are observed depends on the backend (a :class:`DrillStrategy`): replaying the
layer's ATen graph op by op (eager, module, plugin and user torch.compile backends), minifying the
layer's graph against float64 where fused kernels hide intermediate values (Inductor), or running
the layer's ONNX export with every intermediate value as an output (ONNX Runtime).

These records are plain data: strategies produce them, the stage stores them on the
``ValidationResult``, and reports, the CLI, the dashboard and the Model Explorer overlay read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ...jsonio import JsonObject
    from ...modelio.inputs import ModelInputs
    from ...modelio.loader import LoadedModel
    from ..base import Backend, HiddenState

__all__ = ["OperatorRow", "Culprit", "LayerDrilldown", "DrillRequest", "DrillStrategy", "drilled_where"]


def drilled_where(layer: object, step: object = 0) -> str:
    """How views name a drilled layer: ``"layer 1"``, or ``"layer 1 at decode step 2"`` for a
    drill-down of its computation at that step."""
    return f"layer {layer}" + (f" at decode step {step}" if step else "")


@dataclass(frozen=True)
class OperatorRow:
    """One operator of a drilled layer, in graph order.

    ``introduced`` is the error of this operator alone: the alternative's implementation of it run
    on the reference's (float64) inputs to it, cast to the alternative's dtype, against the trusted
    float64 result. ``carried_in`` is the error already present in its inputs in the alternative's
    own run (for the layer's first operators: the rounding of the reference's input hidden state to
    the alternative's dtype, ~2e-8 in float32, never exactly 0). ``bound`` is the calibrated bound ``introduced`` is
    judged by, in the same unit (RMS error). NaN means "could not be observed" (a fused kernel).
    """

    index: int                # position in the captured graph, 0-based
    node: str                 # node id in the exported graph (FX node name, ONNX node name)
    op: str                   # ATen overload ("aten.gelu.default") or ONNX op type ("Gelu")
    module_path: str = ""     # nn.Module path ("encoder.layer.2.intermediate"), "" when unknown
    source: str = ""          # "file.py:123" of the user code that emitted it, "" when unknown
    introduced: float = math.nan
    carried_in: float = math.nan
    bound: float = math.nan

    @property
    def margin(self) -> float:
        """``introduced / bound`` (> 1 introduces error); NaN when either is unknown."""
        if math.isnan(self.introduced) or math.isnan(self.bound):
            return math.nan
        if self.bound <= 0:
            return math.inf if self.introduced > 0 else 0.0
        return self.introduced / self.bound

    @property
    def introduces(self) -> bool:
        """Whether this operator introduces error beyond its bound on its own."""
        m = self.margin
        return not math.isnan(m) and m > 1.0

    def to_dict(self) -> JsonObject:
        return {"index": self.index, "node": self.node, "op": self.op, "module_path": self.module_path,
                "source": self.source, "introduced": _num(self.introduced), "carried_in": _num(self.carried_in),
                "bound": _num(self.bound), "margin": _num(self.margin), "introduces": self.introduces}

    @classmethod
    def from_dict(cls, d: JsonObject) -> OperatorRow:
        return cls(index=int(d["index"]), node=str(d["node"]), op=str(d["op"]),
                   module_path=str(d.get("module_path") or ""), source=str(d.get("source") or ""),
                   introduced=_float(d.get("introduced")), carried_in=_float(d.get("carried_in")),
                   bound=_float(d.get("bound")))


@dataclass(frozen=True)
class Culprit:
    """The operator a drill-down names: the first (in graph order) that introduces error, and the
    directory of a standalone repro for it (``repro.py`` runs alone and fails while the bug is
    there), when one was written and verified."""

    op: str
    node: str
    module_path: str = ""
    source: str = ""
    repro_dir: str | None = None
    verified: bool = False     # the repro was run and reproduced the failure

    def to_dict(self) -> JsonObject:
        return {"op": self.op, "node": self.node, "module_path": self.module_path, "source": self.source,
                "repro_dir": self.repro_dir, "verified": self.verified}

    @classmethod
    def from_dict(cls, d: JsonObject) -> Culprit:
        return cls(op=str(d["op"]), node=str(d["node"]), module_path=str(d.get("module_path") or ""),
                   source=str(d.get("source") or ""), repro_dir=d.get("repro_dir"), verified=bool(d.get("verified")))


@dataclass
class LayerDrilldown:
    """The drill-down of one layer.

    ``method`` says how operators were observed: ``"replay"`` (ATen graph run op by op),
    ``"minifier"`` (fused kernels: the minifier shrank the layer graph against float64),
    ``"onnx"`` (ONNX Runtime with intermediate outputs). ``graph_file`` is the exported graph
    whose node ids the rows' ``node`` refer to (for the Model Explorer overlay), when written.
    ``note`` explains a drill-down that could not name an operator (never silently empty).
    ``step`` is the pass drilled: 0 the prefill, ``s`` the layer's computation at decode step s.
    """

    layer: int
    checkpoint: str                      # the checkpoint that led here, e.g. "post_mlp:3"
    backend: str
    method: str
    operators: list[OperatorRow] = field(default_factory=list)
    culprit: Culprit | None = None
    graph_file: str | None = None
    note: str = ""
    step: int = 0

    @property
    def introducing(self) -> list[OperatorRow]:
        """Operators that introduce error on their own, in graph order."""
        return [row for row in self.operators if row.introduces]

    def to_dict(self) -> JsonObject:
        return {"layer": self.layer, "step": self.step, "checkpoint": self.checkpoint, "backend": self.backend,
                "method": self.method, "operators": [r.to_dict() for r in self.operators],
                "culprit": None if self.culprit is None else self.culprit.to_dict(),
                "graph_file": self.graph_file, "note": self.note}

    @classmethod
    def from_dict(cls, d: JsonObject) -> LayerDrilldown:
        culprit = d.get("culprit")
        return cls(layer=int(d["layer"]), checkpoint=str(d["checkpoint"]), backend=str(d["backend"]),
                   method=str(d["method"]), operators=[OperatorRow.from_dict(r) for r in d.get("operators") or []],
                   culprit=None if not culprit else Culprit.from_dict(culprit),
                   graph_file=d.get("graph_file"), note=str(d.get("note") or ""), step=int(d.get("step") or 0))


@dataclass
class DrillRequest:
    """What a strategy needs to drill one layer.

    ``backend`` is the session's alternative backend, already prepared; ``hidden_in`` is the
    reference's (float64) input to layer ``layer`` (batch, seq, hidden); ``inputs`` the session's
    model inputs (masks, positions); ``out_dir`` a directory this drill-down may write into (the
    session's artifact folder, ``drilldown/layer_<n>``).

    At a decode step (``step`` >= 1) ``hidden_in`` is the reference's input to the layer at that
    step (batch, 1, hidden), ``tokens`` the tokens decoded (batch, >= step) and ``past`` the
    reference's keys and values of the layer before the step (each batch, length, kv_heads,
    head_dim; None where the reference does not expose its cache). Only a strategy with
    ``decode_steps = True`` drills a step.
    """

    layer: int
    checkpoint: str
    backend: Backend             # prepared (strategies check what they need through its capabilities)
    model: LoadedModel
    inputs: ModelInputs          # the session's
    hidden_in: HiddenState       # the reference's float64 input to the layer
    dtype: str                   # the alternative's compute dtype
    device: str
    out_dir: Path
    noise_margin: float = 4.0
    floor_eps: float = 1.0
    step: int = 0
    tokens: np.ndarray | None = None
    past: tuple[HiddenState, HiddenState] | None = None
    #: the session judges at the alternative's emulated precision (``SessionConfig.emulated_precision``,
    #: a torchao module's ``int8_weight_only``): a quantized operator's bound is a correct
    #: quantization's error, not its dtype's rounding
    quantization: bool = False


class DrillStrategy(Protocol):
    """One way to see inside a layer of some kind of backend."""

    name: str

    def applies(self, backend: Backend) -> tuple[bool, str]:
        """``(True, "")`` when this strategy can drill ``backend``'s layers, else ``(False, why)``."""
        ...

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        """Drill one layer. Errors a user can cause are DF errors; a layer that cannot be drilled
        returns a ``LayerDrilldown`` with an empty table and a ``note`` saying why."""
        ...


def _num(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


def _float(x: object) -> float:
    return math.nan if x is None else float(x)
