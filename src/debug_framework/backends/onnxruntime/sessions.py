"""ONNX Runtime's plain sessions on an ONNX graph: what the float64 reference runners of an ONNX
file open (the engine the registry names for ONNX files,
:func:`debug_framework.backends.registry.graph_runtime`), and the session hygiene the
``onnxruntime`` backend shares with them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["open_plain_session", "without_model_bytes", "RUNTIME"]

#: The name a runner records for sessions opened here (``Float64GraphRunner.runtime``).
RUNTIME = "onnxruntime"


def _plain_options() -> ort.SessionOptions:
    """Options for a graph runner's sessions: the graph as written (no optimisation fuses or folds a
    value away), and no memory arena (an arena keeps the largest run's buffers for the session's
    life; a runner's sessions run a few times each)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False
    return options


def open_plain_session(graph: bytes) -> ort.InferenceSession:
    """A CPU session on ``graph`` (a serialized ONNX model) computing it as written; the runtime's own
    exception when it cannot (e.g. no kernel of that precision for an operator)."""
    import onnxruntime as ort

    return ort.InferenceSession(graph, sess_options=_plain_options(), providers=["CPUExecutionProvider"])


def without_model_bytes(session: ort.InferenceSession) -> ort.InferenceSession:
    """``session`` without the serialized model ONNX Runtime's Python session keeps (to build itself
    again on ``set_providers`` or its CUDA fallback; neither is used here): a graph given as bytes
    would otherwise stay in memory beside the session's own copy of its weights. The fallback is
    disabled with it."""
    if getattr(session, "_model_bytes", None) is not None:
        session.disable_fallback()
        session._model_bytes = None
    return session
