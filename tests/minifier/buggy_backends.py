"""Deliberately wrong torch.compile-style backends for the minifier tests and benchmark.

Standalone on purpose (torch only): the minifier copies this file next to generated repros, which
must run where this project is not installed.
"""

import torch
import torch.fx

SIGMOID = torch.ops.aten.sigmoid.default
TANH = torch.ops.aten.tanh.default
ERF = torch.ops.aten.erf.default


def _rewrite(gm, target, replace):
    graph = torch.fx.Graph()
    env = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is target:
            env[n] = replace(graph, graph.node_copy(n, lambda a: env[a]))
        else:
            env[n] = graph.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, graph)


def _scaled(graph, node):
    return graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.01))


def sigmoid_off_by_one_percent(gm, example_inputs):
    """Computes every aten.sigmoid 1% too large (a miscompiled kernel)."""
    return _rewrite(gm, SIGMOID, _scaled).forward


def sigmoid_and_tanh_off(gm, example_inputs):
    """Two independent bugs: sigmoid 1% too large, tanh 1% too large."""
    return _rewrite(_rewrite(gm, SIGMOID, _scaled), TANH, _scaled).forward


def erf_swapped_for_tanh(gm, example_inputs):
    """A wrong op swapped in: aten.erf lowered as aten.tanh."""
    def swap(graph, node):
        node.target = TANH
        return node
    return _rewrite(gm, ERF, swap).forward


def rejects_erf_and_tanh(gm, example_inputs):
    """A compiler with two bugs: no erf lowering (checked first), and a tanh lowering that fails."""
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if targets & {ERF, torch.special.erf, torch.erf}:
        raise NotImplementedError("no lowering for aten.erf")
    if targets & {TANH, torch.tanh}:
        raise RuntimeError("tanh lowering failed: register pressure")
    return gm.forward


def crashes_on_erf(gm, example_inputs):
    """A compiler that kills the process (a segfaulting native backend, simulated with abort)."""
    import os

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (ERF, torch.erf):
            os.abort()
    return gm.forward


def corrupt_node_named(name, factor=1.01):
    """In-process only: scale the output of the node called ``name`` (benchmark oracle)."""
    def backend(gm, example_inputs):
        graph = torch.fx.Graph()
        env = {}
        for n in gm.graph.nodes:
            env[n] = graph.node_copy(n, lambda a: env[a])
            if n.name == name and n.op == "call_function":
                env[n] = graph.call_function(torch.ops.aten.mul.Tensor, (env[n], factor))
        return torch.fx.GraphModule(gm, graph).forward
    return backend


def always_fails(gm, example_inputs):
    """A compiler that rejects every graph (the minifier must still keep one node)."""
    raise RuntimeError("always fails")
