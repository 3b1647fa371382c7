"""The node-level drill-down of the engines that run ONNX graphs: the layer exported alone, every
intermediate value observed, each node replayed alone in the engine. An engine's strategy subclasses
:class:`OnnxNodeStrategy` (naming its backend and label; ONNX Runtime's adds a standalone repro of
the culprit) and lives in its package.

1. The layer is exported alone (the backend's ``export_layer``, one layer at a time, so
   memory stays bounded by one layer's values) and written as ``graph_file``; its node names are
   the rows' node ids.
2. The engine runs it, opened as the backend opens its graphs (``open_session``), with every node
   output a graph output (mark-all), on the reference's input to the layer cast to float32.
3. The trusted run is **the same ONNX graph in float64, evaluated by ONNX's reference evaluator**
   (``onnx.reference``, NumPy). Not the engine in float64 (a runtime's CPU kernels often lack
   double versions, e.g. of ``LayerNormalization`` and ``Gelu``), and not the torch layer in
   float64 (only the values named after FX nodes would have a trusted twin; the ONNX nodes a
   translation adds, e.g. the ``MatMul`` half of a ``linear``, would not). The evaluator is
   independent of the engine and gives a float64 value for every ONNX value, so each node can be
   replayed on trusted inputs. What it cannot see is an exporter bug (the graph itself wrong): that
   shows at the layer level, not here.
4. Each node is judged alone: ``introduced`` is the RMSE of the node as a one-node model in the
   engine on the trusted inputs (cast to the node's dtype) against its trusted output (``inf``
   when the shapes differ or a non-finite value mismatches, never NaN; a node with several outputs
   reports its worst);
   ``carried_in`` the largest RMSE, in the mark-all run, of its inputs computed from the layer's
   hidden input (as the replay counts only the hidden state: not the mask, positions or weights); ``bound`` is issue 14's
   calibrated bound ``noise_margin x noise + floor_eps x eps x RMS(trusted output)``, where the
   noise is what a correct implementation at the node's dtype makes: the reference evaluator run
   at that dtype on the same inputs, and never less than rounding the trusted output to it.
5. The culprit is the first node (graph order) over its bound; an engine whose strategy can write
   a standalone repro of it does (:meth:`OnnxNodeStrategy._culprit`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from .._onnx_file import exact_ops, saturating_rmse
from ...comparison import RatioRule
from ...errors import DebugFrameworkError
from .onnx_graph import (
    FLOAT_TYPES,
    node_origin,
    single_node_model,
    to_float64,
    value_infos,
    value_types,
    with_all_outputs,
)
from .paths import module_path_in_model
from .support import BackendStrategy
from .types import Culprit, DrillRequest, LayerDrilldown, OperatorRow

if TYPE_CHECKING:
    import onnx

    from .._graph_session import LayerExport
    from .._onnx_export import OnnxGraphBackend

__all__ = ["OnnxNodeStrategy", "NodeReplay", "derived_from", "as_declared"]

#: ONNX ops that compute nothing a kernel could get wrong numerically (constants are not judged).
_NOT_JUDGED = frozenset({"Constant"})


def _rmse(trusted: np.ndarray, value: np.ndarray) -> float:
    """RMSE of ``value`` against ``trusted`` over the pairs finite on both sides, in float64, by mark-all's
    rule (:func:`~debug_framework.backends._onnx_file.saturating_rmse`): never NaN; ``inf`` when
    the shapes differ or a non-finite value does not match the trusted one (NaN matches NaN; a value
    saturated in its dtype, an attention mask's ``finfo.min`` in a float16 graph, matches a trusted value
    beyond that range of the same sign: that dtype's rounding, not an error); 0.0 when no pair is finite."""
    value = np.asarray(value)
    big = float(np.finfo(value.dtype).max) if np.issubdtype(value.dtype, np.floating) else math.inf
    t, v = np.asarray(trusted, dtype=np.float64), value.astype(np.float64)
    return math.inf if t.shape != v.shape else saturating_rmse(t, v, big)


def as_declared(value: np.ndarray, elem_type: int | None) -> np.ndarray:
    """A floating feed at the floating type its graph input declares (ONNX ``elem_type``); any other
    feed, or a type NumPy has no array of (bfloat16), as it is."""
    from onnx import helper

    value = np.asarray(value)
    if elem_type not in FLOAT_TYPES or value.dtype.kind != "f":
        return value
    try:
        return value.astype(helper.tensor_dtype_to_np_dtype(elem_type), copy=False)
    except (KeyError, TypeError, ValueError):
        return value


def derived_from(model: onnx.ModelProto, name: str) -> set[str]:
    """The values of ``model``'s graph computed from ``name`` (itself included), through the top-level
    nodes in graph order: what an error in ``name`` can reach (not masks, positions, weights)."""
    reached = {name}
    for node in model.graph.node:
        if any(i in reached for i in node.input if i):
            reached.update(o for o in node.output if o)
    return reached


def _output_margin(introduced: float, bound: float) -> float:
    """``introduced / bound`` as a row computes it (:attr:`OperatorRow.margin`; NaN: not measurable)."""
    return OperatorRow(index=0, node="", op="", introduced=introduced, bound=bound).margin


def _worst_output(measured: list[tuple[float, float, str]]) -> tuple[float, float, str]:
    """Of a node's outputs ``(introduced, bound, name)``, the one its row reports: the largest
    margin over its bound; an output whose margin is NaN (not measurable) is never taken for a
    passing one: it ranks above every passing output, below only a measured failure."""
    def rank(m: tuple[float, float, str]) -> tuple[int, float]:
        margin = _output_margin(m[0], m[1])
        if math.isnan(margin):
            return (1, 0.0)
        return (2 if margin > 1.0 else 0, margin)

    return max(measured, key=rank)


#: What a node's repro needs: the one-node model (``onnx.ModelProto``), its feeds, the judged output.
NodeReplay: TypeAlias = "tuple[onnx.ModelProto, dict[str, np.ndarray], str]"


class _Undrillable(Exception):
    """The layer's graph cannot be run both ways (the drill-down returns a note saying why)."""


def _unjudged_row(node: onnx.NodeProto, index: int, layer_name: str) -> OperatorRow:
    """The row of ``node`` with its origin and no measurement (NaN errors)."""
    origin = node_origin(node)
    op = f"{node.op_type} ({origin.aten})" if origin.aten else node.op_type
    return OperatorRow(index=index, node=node.name, op=op, module_path=module_path_in_model(origin.module_path, layer_name),
                       source=origin.source)


class _Values:
    """The layer's values in both runs: ``observed`` (the engine, the graph's dtypes) and
    ``trusted`` (float64), with initializers and graph inputs."""

    def __init__(self, observed: dict[str, np.ndarray], trusted: dict[str, np.ndarray], infos: dict[str, onnx.ValueInfoProto],
                 carriers: set[str]) -> None:
        self.observed, self.trusted, self.infos, self.types = observed, trusted, infos, value_types(infos)
        self.carriers = carriers  # the values computed from the layer's hidden input (carried_in counts only these)

    def np_dtype(self, name: str) -> np.dtype:
        import onnx

        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.types[name]))

    def trusted_feed(self, name: str) -> np.ndarray:
        """The trusted value of ``name`` cast to the graph's dtype of it (what a node replay is fed)."""
        return np.asarray(self.trusted[name]).astype(self.np_dtype(name))

    def is_float(self, name: str) -> bool:
        return self.types.get(name) in FLOAT_TYPES


class OnnxNodeStrategy(BackendStrategy):
    """Drill layers of an engine that runs ONNX graphs node by node (see the module docstring). A
    subclass names the engine (``name``, ``backend_name``, ``label``; ``method`` is ``export_layer``)
    and may write a repro of the culprit (:meth:`_culprit`)."""

    method = "export_layer"

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        out = self._start(request)
        import onnx

        backend = request.backend
        drill = LayerDrilldown(layer=request.layer, checkpoint=request.checkpoint, backend=backend.name, method=self.name)
        hidden64 = np.asarray(request.hidden_in, dtype=np.float64)
        try:
            export = backend.export_layer(request.layer, hidden64.astype(np.float32), request.inputs,
                                          out / f"layer{request.layer}.onnx")
            model = onnx.load(str(export.path))
            values = self._run_both(backend, model, export, hidden64)
        except (DebugFrameworkError, _Undrillable) as exc:
            drill.note = f"layer {request.layer} could not be drilled: {exc}"
            return drill
        drill.graph_file = str(export.path)
        replays: dict[str, NodeReplay] = {}
        unjudged: list[str] = []
        not_replayed: set[str] = set()
        twinless: list[str] = []  # a value only the alternative file has: no trusted twin to judge it by
        for index, node in enumerate(model.graph.node):
            if node.op_type in _NOT_JUDGED or not any(values.is_float(o) for o in node.output if o):
                continue
            if any(x and x not in values.trusted for x in (*node.input, *node.output)):
                drill.operators.append(_unjudged_row(node, index, export.layer_name))  # e.g. a conversion's Cast
                not_replayed.add(node.name)
                twinless.append(node.name)
                continue
            try:
                row, replays[node.name] = self._judge(backend, model, node, index, values, export, request)
            except Exception as exc:  # noqa: BLE001 - one node the engine cannot run alone: unjudged, said so
                row = _unjudged_row(node, index, export.layer_name)
                not_replayed.add(node.name)
                unjudged.append(f"{node.name} ({type(exc).__name__}: {str(exc)[:200]})")
            drill.operators.append(row)
        notes = [f"{len(unjudged)} node(s) could not be replayed alone: {'; '.join(unjudged)}"] if unjudged else []
        if twinless:
            notes.append(f"{len(twinless)} node(s) read or make a value the session's own file does not have "
                         f"(added by a conversion), not judged: {', '.join(twinless)}")
        unmeasured = [r.node for r in drill.operators if math.isnan(r.margin) and r.node not in not_replayed]
        if unmeasured:  # e.g. non-finite both in the engine and at the node's dtype: not a pass either
            notes.append(f"{len(unmeasured)} node(s) have an error that cannot be set against its bound "
                         f"(NaN margin, not counted as passing): {', '.join(unmeasured)}")
        culprit_row = next((r for r in drill.operators if r.introduces), None)
        if culprit_row is None:
            worst = max(drill.operators, key=lambda r: -1.0 if math.isnan(r.margin) else r.margin, default=None)
            notes.insert(0, "no ONNX node introduces error on its own" +
                         (f" (largest margin {worst.margin:.2f} at {worst.node})" if worst is not None else ""))
            drill.note = "; ".join(notes)
            return drill
        drill.note = "; ".join(notes)
        drill.culprit = self._culprit(culprit_row, replays[culprit_row.node], values, backend, out)
        return drill

    # -- the two runs ---------------------------------------------------------------------------------
    def _run_both(self, backend: OnnxGraphBackend, model: onnx.ModelProto, export: LayerExport,
                  hidden64: np.ndarray) -> _Values:
        """The engine (mark-all, float32 feeds) and the reference evaluator (float64) on the layer."""
        from onnx import numpy_helper
        from onnx.reference import ReferenceEvaluator

        infos = value_infos(model)
        types = value_types(infos)
        marked, names = with_all_outputs(model, infos)
        wanted = {i.name for i in model.graph.input}
        feeds = {k: v for k, v in export.feeds.items() if k in wanted}
        feeds[export.hidden_input] = hidden64
        feeds = {k: as_declared(v, types.get(k)) for k, v in feeds.items()}  # a float16 file's layer reads float16
        session = backend.open_session(marked.SerializeToString(), export.path)
        try:
            observed = dict(zip(names, session.run(names, feeds), strict=True))
        except Exception as exc:  # noqa: BLE001 - a runtime raises its own exception types
            raise _Undrillable(f"{self.label} failed on the layer with every value as an output: {exc}") from exc
        feeds64 = {k: (v.astype(np.float64) if types.get(k) in FLOAT_TYPES else v) for k, v in feeds.items()}
        feeds64[export.hidden_input] = hidden64
        marked64 = to_float64(marked)
        try:
            trusted, own = self._trusted(export, marked64, names, feeds64, hidden64)
        except Exception as exc:  # noqa: BLE001 - an op the reference evaluator lacks
            raise _Undrillable(f"ONNX's reference evaluator cannot run the layer in float64: {exc}") from exc
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        inits64 = {t.name: numpy_helper.to_array(t) for t in marked64.graph.initializer}
        values = _Values({**inits, **feeds, **observed}, {**inits64, **feeds64, **trusted}, infos,
                         derived_from(model, export.hidden_input))
        values.own = own
        return values

    @staticmethod
    def _trusted(export: LayerExport, marked64: onnx.ModelProto, names: list[str], feeds64: dict[str, np.ndarray],
                 hidden64: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[onnx.ModelProto, _Values] | None]:
        """Every value of the layer in float64: its own graph, or, for an alternative model file, the
        same layer of the session's own file (values matched by name; a value only the alternative
        has, e.g. a conversion's Cast, has no trusted twin and its node is not judged); and that
        file's layer with its values, whose nodes give the noise of a correct run (None without it)."""
        import onnx
        from onnx import numpy_helper
        from onnx.reference import ReferenceEvaluator

        ref_path = getattr(export, "reference_path", None)
        if ref_path is None:
            evaluator = ReferenceEvaluator(marked64, new_ops=exact_ops())
            return dict(zip(names, evaluator.run(names, feeds64), strict=True)), None
        own = onnx.load(str(ref_path))
        own_marked, own_names = with_all_outputs(own, value_infos(own))
        wanted = {i.name for i in own.graph.input}
        feeds = {k: v for k, v in feeds64.items() if k in wanted}
        feeds[own.graph.input[0].name] = hidden64
        own64 = to_float64(own_marked)
        evaluator = ReferenceEvaluator(own64, new_ops=exact_ops())
        trusted = dict(zip(own_names, evaluator.run(own_names, feeds), strict=True))
        inits64 = {t.name: numpy_helper.to_array(t) for t in own64.graph.initializer}
        everything = {**inits64, **feeds, **trusted}
        return trusted, (own, _Values(everything, everything, value_infos(own), set()))

    # -- one node -------------------------------------------------------------------------------------
    def _judge(self, backend: OnnxGraphBackend, model: onnx.ModelProto, node: onnx.NodeProto, index: int,
               values: _Values, export: LayerExport,
               request: DrillRequest) -> tuple[OperatorRow, NodeReplay]:
        """The node's row, and what its repro needs (the one-node model, its feeds, the judged output)."""
        single = single_node_model(model, node, values.infos)
        feeds = {n: values.trusted_feed(n) for n in dict.fromkeys(x for x in node.input if x)}
        outputs = [o for o in node.output if o and values.is_float(o)]
        session = backend.open_session(single.SerializeToString(), export.path)
        got = dict(zip(outputs, session.run(outputs, feeds), strict=True))
        own = getattr(values, "own", None)
        noise = self._noise(single, feeds, outputs, values) if own is None else self._own_noise(node, outputs, values, own)
        measured: list[tuple[float, float, str]] = []  # (introduced, bound, output)
        for name in outputs:
            trusted = values.trusted[name]
            introduced = _rmse(trusted, got[name])
            eps = float(np.finfo(values.np_dtype(name)).eps)
            rule = RatioRule.calibrated(trusted, eps, margin=request.noise_margin, floor_eps=request.floor_eps)
            measured.append((introduced, rule.judge(noise[name], introduced).bound, name))
        best = _worst_output(measured)
        carried = [_rmse(values.trusted[n], values.observed[n]) for n in feeds if values.is_float(n)
                   and n in values.carriers]
        row = replace(_unjudged_row(node, index, export.layer_name), introduced=best[0],
                      carried_in=max(carried, default=0.0), bound=best[1])
        return row, (single, feeds, best[2])

    @staticmethod
    def _noise(single: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str], values: _Values) -> dict[str, float]:
        """Per output, the error a correct implementation at the node's dtype makes: the reference
        evaluator at that dtype, never less than rounding the trusted output to the dtype."""
        from onnx.reference import ReferenceEvaluator

        rounding = {n: _rmse(values.trusted[n], np.asarray(values.trusted[n]).astype(values.np_dtype(n))) for n in outputs}
        try:
            evaluator = ReferenceEvaluator(single, new_ops=exact_ops())
            low = dict(zip(outputs, evaluator.run(outputs, feeds), strict=True))
        except Exception:  # noqa: BLE001 - an op the evaluator lacks at this dtype: rounding only
            return rounding
        return {n: max(rounding[n], _rmse(values.trusted[n], np.asarray(low[n]))) for n in outputs}

    @classmethod
    def _own_noise(cls, node: onnx.NodeProto, outputs: list[str], values: _Values, own: tuple[onnx.ModelProto, _Values]
                   ) -> dict[str, float]:
        """An alternative model file's node: the noise of a correct run is its twin in the session's
        own file (the node making the same values) at the node's dtype; rounding alone without a twin."""
        own_model, own_values = own
        rounding = {n: _rmse(values.trusted[n], np.asarray(values.trusted[n]).astype(values.np_dtype(n))) for n in outputs}
        twin = next((x for x in own_model.graph.node if list(x.output) == list(node.output)), None)
        if twin is None:
            return rounding
        single = single_node_model(own_model, twin, own_values.infos)
        feeds = {n: own_values.trusted_feed(n).astype(values.np_dtype(outputs[0]) if own_values.is_float(n)
                                                     else own_values.np_dtype(n))
                 for n in dict.fromkeys(x for x in twin.input if x)}
        measured = cls._noise(single, feeds, outputs, own_values)
        return {n: max(rounding[n], measured.get(n, 0.0)) for n in outputs}

    def _culprit(self, row: OperatorRow, replay: NodeReplay, values: _Values, backend: OnnxGraphBackend,
                 out: Path) -> Culprit:
        """The culprit of ``row``; this engine writes no standalone repro of it (a subclass whose
        engine can, does)."""
        return Culprit(op=row.op, node=row.node, module_path=row.module_path, source=row.source)
