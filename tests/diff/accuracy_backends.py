"""A deliberately wrong torch.compile backend for the KernelDiff -> minifier end-to-end test.

Module-level and standalone on purpose (torch only): the minifier refers to the backend from the
generated ``repro.py`` by copying this file next to it, and that repro must run where this project
is not importable.
"""

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

MUL = torch.ops.aten.mul.Tensor


def mul_off_by_one_percent(gm, example_inputs):
    """Lowers the Dynamo graph to ATen (``make_fx``), then computes every ``aten.mul.Tensor`` 1% too large
    (a miscompiled multiply kernel)."""
    aten = make_fx(gm, tracing_mode="real")(*example_inputs)
    for node in list(aten.graph.nodes):
        if node.op == "call_function" and node.target is MUL:
            with aten.graph.inserting_after(node):
                scaled = aten.graph.call_function(MUL, (node, 1.01))
            node.replace_all_uses_with(scaled)
            scaled.args = (node, 1.01)
    aten.recompile()
    return aten.forward
