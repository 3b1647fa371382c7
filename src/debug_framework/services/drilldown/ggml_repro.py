"""The standalone repro of a ggml node the ``ggml`` drill-down names, where one can be made: a
projection node (llama.cpp's ``Qcur-i``, ``Kcur-i``, ``Vcur-i``, ``attn_out-i``, ``ffn_gate-i``,
``ffn_up-i``, ``ffn_out-i``, a mixture of experts' router ``ffn_moe_logits-i``) is one matrix product of a node the engine computed before it and one
weight of the model, so its inputs can be taken out of the graph.

The repro directory (the one repro format, :mod:`debug_framework.repro_format`, writer
``drilldown-ggml``) holds ``input.npy`` (the node's input as llama.cpp computed it: ``attn_norm-i``,
``kqv_out-i``, ``ffn_norm-i`` or the MLP's activation, at the real token positions), ``weight.npy``
(and ``bias.npy``: the model's weight as the reference reads it, Hugging Face's layout ``[out, in]``),
``engine.npy`` (the node's output as llama.cpp computed it) and ``repro.py``: it runs the reference's
matching operation, ``input @ weight.T (+ bias)``, in float64 beside the engine's output and says
``REPRO: reproduced`` (exit 1) while their RMS difference is beyond the node's calibrated bound.
It needs NumPy alone; the arrays are read with ``allow_pickle=False``. A node that is not one
product (a norm, the rotation, attention, the activation, a residual) gets no repro: its inputs are
several nodes and llama.cpp's kernels in between, and the drill-down's note says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...repro_format import verify, write_repro_files

if TYPE_CHECKING:
    from ...backends.drilldown.types import DrillRequest, OperatorRow

__all__ = ["PROJECTIONS", "write_node_repro"]

#: trace name of a projection -> (the weight's name in the family's layout, the trace name of its input)
PROJECTIONS: dict[str, tuple[str, str]] = {
    "q": ("q", "attn_norm"), "k": ("k", "attn_norm"), "v": ("v", "attn_norm"), "attn_out": ("o", "attn"),
    "ffn_gate": ("gate", "ffn_norm"), "ffn_up": ("up", "ffn_norm"), "ffn_out": ("down", "ffn_act"),
    "router_logits": ("router", "ffn_norm"),  # a mixture of experts' router (llama.cpp's ffn_moe_logits-i)
}

_BODY = '''
import numpy


def load(name):
    return numpy.load(os.path.join(HERE, name), allow_pickle=False).astype(numpy.float64)


def check():
    spec = manifest()["check"]
    x, w, engine = load("input.npy"), load("weight.npy"), load("engine.npy")
    trusted = x @ w.T
    if spec["bias"]:
        trusted = trusted + load("bias.npy")
    what = "%s = %s @ %s.T" % (spec["node"], spec["input_node"], spec["weight"])
    if engine.shape != trusted.shape:
        return True, "%s: the engine's output has shape %s, the product %s" % (
            what, list(engine.shape), list(trusted.shape)), {"node": spec["node"], "bound": spec["bound"]}
    err = float(numpy.sqrt(numpy.mean((engine - trusted) ** 2)))
    relation = ">" if err > spec["bound"] else "<="
    detail = "%s: RMS difference of llama.cpp's node from the float64 product %.3e %s bound %.3e" % (
        what, err, relation, spec["bound"])
    return err > spec["bound"], detail, {"node": spec["node"], "rmse": err, "bound": spec["bound"]}
'''


def _weight_name(request: DrillRequest, key: str) -> str | None:
    """The model's tensor name of layer ``request.layer``'s weight ``key`` (``"q"`` ...: the family's
    layout), None where the family has none of that name (Phi-3's fused projections)."""
    from ...architectures import build_reference

    layout = build_reference(request.model.config, request.model.weights, np.float64).layout
    inner = layout.layer.get(key)
    return None if inner is None else layout.layer_prefix.format(i=request.layer) + inner


def write_node_repro(request: DrillRequest, row: OperatorRow, node: str, nodes: dict[str, str],
                     engine: dict[str, np.ndarray], real: np.ndarray) -> tuple[Path | None, bool, str]:
    """Write and verify the repro of the culprit ``row`` (llama.cpp node ``node``) from the engine's
    traced values ``engine`` (trace name -> ``[B, T, ...]``) of the drilled layer at the token
    positions ``real`` ``[B, T]``: ``(directory, verified, why not)``; the directory is None where
    no repro can be made (``why not`` says why)."""
    if row.op not in PROJECTIONS:
        return None, False, f"no standalone repro: {node} is not one matrix product of a node and a weight"
    key, source = PROJECTIONS[row.op]
    weight = _weight_name(request, key)
    if weight is None:
        return None, False, (f"no standalone repro: {node} is not one matrix product with a weight of this family "
                             "(a mixture of experts' output is a weighted sum of the chosen experts')")
    if weight not in request.model.weights or source not in engine or row.op not in engine:
        return None, False, f"no standalone repro: the input of {node} or its weight is not at hand"
    folder = Path(request.out_dir) / "repro"
    folder.mkdir(parents=True, exist_ok=True)
    x = np.asarray(engine[source])[real]
    out = np.asarray(engine[row.op])[real]
    np.save(folder / "input.npy", x.reshape(x.shape[0], -1).astype(np.float32), allow_pickle=False)
    np.save(folder / "engine.npy", out.reshape(out.shape[0], -1).astype(np.float32), allow_pickle=False)
    np.save(folder / "weight.npy", request.model.weights.numpy(weight, np.float32), allow_pickle=False)
    bias = weight.removesuffix("weight") + "bias"
    has_bias = bias in request.model.weights
    if has_bias:
        np.save(folder / "bias.npy", request.model.weights.numpy(bias, np.float32), allow_pickle=False)
    check = {"node": node, "op": row.op, "input_node": nodes.get(source, source), "weight": weight,
             "bias": bias if has_bias else None, "bound": float(row.bound), "introduced": float(row.introduced),
             "layer": request.layer}
    write_repro_files(folder, writer="drilldown-ggml", body=_BODY, imports=["import numpy"], requires=["numpy"],
                      failure=f"llama.cpp node {node} differs from {check['input_node']} @ {weight}.T beyond its bound",
                      check=check, title=f"llama.cpp node {node} of layer {request.layer}")
    return folder, verify(folder).reproduced, ""
