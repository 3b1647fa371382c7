"""Backends that edit the graph they are given in place, as users write them (``docs/kerneldiff.md``'s
``buggy_backend`` does): the tool must hand each one a copy it never reuses, or its own reference run
has the bug too. Module-level and torch-only: a generated repro copies this file next to itself."""

import operator

import torch


def exp_to_expm1(gm, example_inputs):
    """Retargets every ``torch.exp`` call to ``torch.expm1`` (off by one), in place."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.exp:
            n.target = torch.expm1
    gm.recompile()
    return gm.forward


def add_to_sub(gm, example_inputs):
    """Turns every tensor addition into a subtraction, in place (the target and nothing else)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (operator.add, torch.add):
            n.target = operator.sub
    gm.recompile()
    return gm.forward


def mul_constant_args(gm, example_inputs):
    """Rewrites the constant of every ``x * c`` in the node's own ``args`` (c -> 1.5 c) and marks its
    ``meta``, in place."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (operator.mul, torch.mul) and isinstance(n.args[1], float):
            n.args = (n.args[0], n.args[1] * 1.5)
            n.meta["rewritten"] = True
    gm.recompile()
    return gm.forward


def fc1_plus_tenth(gm, example_inputs):
    """``docs/kerneldiff.md``'s ``buggy_backend``: adds 0.1 to fc1's output, editing ``gm`` in place."""
    node = [n for n in gm.graph.nodes if n.op == "call_function"
            and list((n.meta.get("nn_module_stack") or {"": ("", None)}).values())[-1][0].endswith("fc1")][-1]
    with gm.graph.inserting_after(node):
        new = gm.graph.call_function(torch.add, (node, 0.1))
    node.replace_all_uses_with(new)
    new.args = (node, 0.1)
    gm.recompile()
    return gm.forward
