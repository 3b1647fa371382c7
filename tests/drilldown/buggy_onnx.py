"""Deliberately wrong ONNX graph transforms (an OnnxRuntimeBackend ``graph_transform``) for the
drill-down tests. Standalone on purpose (onnx only): repros copy this file next to themselves."""

import onnx


def gelu_tanh(model):
    """Every ``Gelu`` computed with the tanh approximation (a deployment rewrite gone wrong)."""
    for node in model.graph.node:
        if node.op_type == "Gelu":
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("approximate", "tanh"))
    return model

