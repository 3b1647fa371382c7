"""Drilling any engine that names its intermediate values: a NumPy engine, an engine in C behind a
Python binding, llama.cpp's graph nodes. No graph of the engine is needed.

The engine runs layer ``i`` on the reference's input to it and reports its intermediate values by
name, in the order it computed them (``run_layer_traced``: the capability ``layer_trace``; names of
``architectures.walk.TRACE_NAMES``: ``attn_norm``, ``q``, ``k``, ``v``, ``q_rope``, ``k_rope``,
``attn``, ``attn_out``, ``post_attention``, ``ffn_norm``, ``ffn_gate``, ``ffn_up``, ``ffn_act``,
``ffn_out``, ``post_mlp``). The reference model written from the math runs the same layer on the
same input in float64 and records the same names (``Model.traced_layer``); the same model at the
engine's precision is the calibration (a correct run's error at each name). Each name the engine
reports and the reference records is judged in the engine's order by the calibrated rule of every
drill-down (``noise_margin x`` the correct run's error ``+ floor_eps x eps x`` its scale). Every
value before the first one beyond its bound is within its own, so the error that value shows is
introduced by the step that computed it: that step is the culprit. ``introduced`` is the error at
the value, ``carried_in`` the largest error of the values before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...backends.capabilities import capabilities
from ...comparison import float64_array
from ...errors import ConfigurationError
from ...backends.drilldown.types import Culprit, DrillRequest, LayerDrilldown, OperatorRow

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...modelio.inputs import ModelInputs
    from ...modelio.loader import LoadedModel

__all__ = ["TraceStrategy"]

#: what each name computes, for the culprit's line
_STEP = {"attn_norm": "the attention's input norm", "q": "the query projection", "k": "the key projection",
         "v": "the value projection", "q_rope": "the rotary embedding of the queries",
         "k_rope": "the rotary embedding of the keys", "attn": "attention (scores, softmax, weighted values)",
         "attn_out": "the attention's output projection", "post_attention": "the attention's residual",
         "ffn_norm": "the MLP's input norm", "router_logits": "the router (the experts' logits)", "ffn_gate": "the MLP's gate projection", "ffn_up": "the MLP's up projection",
         "ffn_act": "the MLP's activation", "ffn_out": "the MLP's down projection", "post_mlp": "the MLP's residual"}


def _trace(model: LoadedModel, dtype: str, i: int, hidden: np.ndarray, inputs: ModelInputs) -> dict[str, np.ndarray]:
    """Layer ``i``'s named intermediate values in the reference written from the math: over NumPy
    in float64 (``python_reference``'s), over torch at another dtype (``torch_reference``'s, the
    calibration), the input rounded once to that dtype; each value back in float64."""
    import torch

    from ...architectures import build_reference
    from ...architectures.xp import torch_namespace

    if dtype == "float64":
        net = build_reference(model.config, model.weights, np.float64)
        net.positions = inputs.position_ids()
        trace = net.traced_layer(i, hidden, np.asarray(inputs.attention_mask, np.int64))
    else:
        xp = torch_namespace()
        net = build_reference(model.config, model.weights, dtype, xp)
        net.positions = inputs.position_ids()
        with torch.no_grad():
            trace = net.traced_layer(i, xp.from_host(hidden, net.dtype),
                                     torch.from_numpy(np.asarray(inputs.attention_mask, np.int64)))
    return {name: float64_array(value) for name, value in trace.items()}


def _layout_like(value: np.ndarray, like: np.ndarray) -> np.ndarray | None:
    """``value`` in the layout of ``like`` where only the heads' axes differ (``[B, H, T, E]``
    against ``[B, T, H*E]``); None where the shapes do not correspond."""
    if value.shape == like.shape:
        return value
    if value.ndim == 4 and like.ndim == 4 and (value.shape[0], value.shape[2], value.shape[1], value.shape[3]) \
            == like.shape:  # [B, T, H, E] against the reference's [B, H, T, E]
        return value.transpose(0, 2, 1, 3)
    if value.ndim == 4 and like.ndim == 3 and value.shape[0] == like.shape[0] and value.shape[2] == like.shape[1]:
        merged = value.transpose(0, 2, 1, 3).reshape(value.shape[0], value.shape[2], -1)
        return merged if merged.shape == like.shape else None
    if value.size == like.size:
        return value.reshape(like.shape)
    return None


class TraceStrategy:
    """The drill-down of a backend with the ``layer_trace`` capability (see the module)."""

    name = "trace"
    #: drills the prefill only: a decode step's trace would need the engine's own cache at that step
    decode_steps = False

    def applies(self, backend: Backend) -> tuple[bool, str]:
        support = capabilities(backend).layer_trace
        return support.ok, support.why

    def calibration_trace(self, request: DrillRequest, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """The calibration's named values of the drilled layer (a correct run at the engine's
        precision): the reference written from the math over torch at the request's dtype; an
        engine whose precision is more than a dtype (llama.cpp's) traces its own emulation."""
        return _trace(request.model, request.dtype, request.layer, hidden, request.inputs)

    def reference_trace(self, request: DrillRequest, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """The reference's named values of the drilled layer: the model written from the math in float64."""
        return _trace(request.model, "float64", request.layer, hidden, request.inputs)

    def engine_trace(self, request: DrillRequest, hidden: np.ndarray) -> list[tuple[str, object]]:
        """The engine's named values of the drilled layer, in its order (``run_layer_traced``)."""
        dtype = request.dtype
        return request.backend.run_layer_traced(  # type: ignore[attr-defined, no-any-return]
            request.layer, hidden.astype(np.float32) if dtype != "float64" else hidden.copy(), request.inputs.copy())

    def real_positions(self, request: DrillRequest) -> np.ndarray:
        """``[B, T]``: the token positions the values are judged at (padded ones are no output)."""
        return np.asarray(request.inputs.attention_mask).astype(bool)

    def drill(self, request: DrillRequest) -> LayerDrilldown:
        import torch

        from ...comparison import RatioRule
        from .judge import rms_error, value_scale

        ok, why = self.applies(request.backend)
        if not ok:
            raise ConfigurationError(f"the trace drill-down cannot drill this backend: {why}",
                                     hint="give the backend's runner run_layer_traced(i, hidden_in, inputs)")
        Path(request.out_dir).mkdir(parents=True, exist_ok=True)
        i, dtype = request.layer, request.dtype
        entry = LayerDrilldown(layer=i, checkpoint=request.checkpoint, backend=request.backend.name,
                               method=self.name)
        if request.model.architecture == "generic":
            entry.note = "no reference written from the math records this family's intermediate values"
            return entry
        h = np.asarray(request.hidden_in, np.float64)
        traces = {"reference": self.reference_trace(request, h), "calibration": self.calibration_trace(request, h)}
        own = self.engine_trace(request, h)
        torch_dtype = getattr(torch, dtype)
        eps = torch.finfo(torch_dtype).eps
        rows: list[OperatorRow] = []
        unmatched: list[str] = []
        carried = 0.0
        positions = self.real_positions(request)
        for name, value in own:
            trusted = traces["reference"].get(name)
            if trusted is None:
                unmatched.append(name)
                continue
            alt = _layout_like(float64_array(value), trusted)
            cal = _layout_like(traces["calibration"][name], trusted)
            if alt is None:
                unmatched.append(f"{name} (shape {tuple(np.shape(value))})")
                continue
            t = torch.as_tensor(_real(trusted, positions))
            err = rms_error(torch.as_tensor(_real(alt, positions)), t)
            noise = rms_error(torch.as_tensor(_real(cal, positions)), t) if cal is not None else 0.0
            rule = RatioRule.calibrated(value_scale(t, torch_dtype), eps, margin=request.noise_margin,
                                        floor_eps=request.floor_eps)
            rows.append(OperatorRow(index=len(rows), node=name, op=name, module_path=f"layer {i}",
                                    source=_STEP.get(name, ""), introduced=err, carried_in=carried,
                                    bound=rule.judge(noise, err).bound))
            carried = max(carried, err)
        entry.operators = rows
        first = next((r for r in rows if r.introduces), None)
        notes = []
        if unmatched:
            notes.append("not compared (no value of that name or shape in the reference): " + ", ".join(unmatched))
        if first is not None:
            entry.culprit = Culprit(op=first.op, node=first.node, module_path=first.module_path, source=first.source)
            notes.insert(0, f"the first value beyond its bound is {first.op} ({first.source}); every value the "
                            "engine reported before it is within its own")
        else:
            notes.insert(0, "every value the engine reported is within its bound: the error shows only where "
                            "they are combined" if rows else "the engine reported no value the reference records")
        entry.note = "; ".join(notes) + "; no standalone repro (the engine's steps run inside it)"
        return entry


def _real(value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The values of ``value`` (``[B, T, ...]`` or ``[B, H, T, E]``) at the real, unpadded positions
    of ``mask`` ``[B, T]``: padded positions are no output of the model."""
    if value.ndim >= 2 and value.shape[:2] == mask.shape:
        return value[mask]
    if value.ndim == 4 and (value.shape[0], value.shape[2]) == mask.shape:
        return value.transpose(0, 2, 1, 3)[mask]
    return value
