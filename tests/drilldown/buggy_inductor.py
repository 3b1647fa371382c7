"""A deliberately wrong Inductor for the drill-down tests: a torch.compile backend that compiles
with Inductor plus a post-grad pass computing every ``aten.erf`` 1% too large (what GELU lowers
to), i.e. one operator miscompiled. Standalone on purpose (torch only): the minifier copies this
file next to the repros it writes, which must run where this project is not installed."""

import torch
from torch._inductor import config
from torch._inductor.compile_fx import compile_fx

ERF = torch.ops.aten.erf.default


def _erf_one_percent_off(graph):
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is ERF:
            with graph.inserting_after(node):
                scaled = graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.01))
            node.replace_all_uses_with(scaled)
            scaled.args = (node, 1.01)


def inductor_erf_off(gm, example_inputs):
    """Inductor, with every erf 1% off (a post-grad pass: after decompositions, before lowering)."""
    with config.patch(post_grad_custom_post_pass=_erf_one_percent_off):
        return compile_fx(gm, example_inputs)


def refuses_gelu(gm, example_inputs):
    """A compiler that fails on the layer (a crash, not a numerical finding)."""
    if any(node.target is torch.ops.aten.gelu.default for node in gm.graph.nodes):
        raise NotImplementedError("no lowering for aten.gelu")
    return compile_fx(gm, example_inputs)
