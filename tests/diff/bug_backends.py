"""Deliberately wrong torch.compile backends, one per class of real wrong-result bug (torch only).

Each is AOTAutograd (as ``aot_eager``) with one ATen op rewritten in the forward, backward and
inference graphs: deterministic on any CPU, cheap to compile, and standalone, because a generated
``repro.py`` imports the backend by copying this file beside it. The classes:

- ``mul_one_percent``: every floating ``aten.mul.Tensor`` 1% too large (for graphs that change an input in place);
- ``int_index_int32``: integer multiplies computed in int32 (an overflow in an index computation);
- ``int8_add_widened``: an int8 ``aten.add.Tensor`` returns int64 (a dtype-only difference, equal values);
- ``relu_grad_scaled``: ``aten.threshold_backward`` 50% too large (only gradients are wrong);
- ``where_as_arithmetic``: ``aten.where.self`` as ``a*c + b*(1-c)`` (NaN where eager is finite);
- ``softmax_unstable``: ``aten._softmax`` without subtracting the max (overflows on huge values).
"""

import torch
import torch.fx

aten = torch.ops.aten


def _int32_mul(a, b):
    """An int64 multiply done in int32 (wraps around), then widened back."""
    a32 = a.to(torch.int32) if isinstance(a, torch.Tensor) else a
    b32 = b.to(torch.int32) if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=torch.int64).to(torch.int32)
    return torch.mul(a32, b32).to(torch.int64)


def _where_arith(cond, a, b):
    c = cond.to(a.dtype if isinstance(a, torch.Tensor) else torch.float32)
    return a * c + b * (1 - c)


def _softmax_naive(x, dim, half_to_float):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _rewrite(gm, match, replace):
    """Rewrite every node ``match(node)`` accepts into ``replace`` (a function on the node's args)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and match(node):
            node.target = replace
    gm.graph.lint()
    gm.recompile()
    return gm


def _post(gm, match, after):
    """Insert ``after(node)`` behind every node ``match(node)`` accepts (its users read the new node)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and match(node):
            with gm.graph.inserting_after(node):
                new = gm.graph.call_function(after, (node,))
            node.replace_all_uses_with(new)
            new.args = (node,)
    gm.graph.lint()
    gm.recompile()
    return gm


def _aot(gm, example_inputs, transform):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def compiler(g, _inputs):
        return make_boxed_func(transform(g).forward)

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)(gm, example_inputs)


def _floating(node):
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def _scale_one_percent(x):
    return x * 1.01


def _scale_half(x):
    return x * 1.5


def _to_int64(x):
    return x.to(torch.int64)


def mul_one_percent(gm, example_inputs):
    return _aot(gm, example_inputs, lambda g: _post(g, lambda n: n.target is aten.mul.Tensor and _floating(n),
                                                     _scale_one_percent))


def int_index_int32(gm, example_inputs):
    def is_int_mul(n):
        v = _val(n)
        return n.target is aten.mul.Tensor and isinstance(v, torch.Tensor) and v.dtype == torch.int64
    return _aot(gm, example_inputs, lambda g: _rewrite(g, is_int_mul, _int32_mul))


def int8_add_widened(gm, example_inputs):
    def is_int8_add(n):
        v = _val(n)
        return n.target is aten.add.Tensor and isinstance(v, torch.Tensor) and v.dtype == torch.int8
    return _aot(gm, example_inputs, lambda g: _post(g, is_int8_add, _to_int64))


def relu_grad_scaled(gm, example_inputs):
    return _aot(gm, example_inputs, lambda g: _post(g, lambda n: n.target is aten.threshold_backward.default,
                                                     _scale_half))


def where_as_arithmetic(gm, example_inputs):
    return _aot(gm, example_inputs, lambda g: _rewrite(g, lambda n: n.target is aten.where.self, _where_arith))


def softmax_unstable(gm, example_inputs):
    return _aot(gm, example_inputs, lambda g: _rewrite(g, lambda n: n.target is aten._softmax.default,
                                                       _softmax_naive))


def more_precise(gm, example_inputs):
    """Not a bug: runs the graph in float64 and rounds each floating output back to the precision of
    the inputs, as a fusing compiler that keeps intermediates in higher precision does (a
    precision-only difference from eager, which rounds after every op)."""
    low = next((x.dtype for x in example_inputs if isinstance(x, torch.Tensor) and x.is_floating_point()),
               torch.float32)

    def run(*args):
        wide = [a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        out = gm(*wide)
        return type(out)(o.to(low) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out)

    return run


def backward_scaled(gm, example_inputs):
    """A bug in the backward compiler alone: the forward graph is compiled as is, every floating
    gradient the backward graph returns is scaled by 1.5. A backward graph handed to this backend on
    its own is compiled as a forward graph, correctly: the failure shows only through AOTAutograd's
    joint compile, never on an isolated graph."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def forward(g, _inputs):
        return make_boxed_func(g.forward)

    def backward(g, _inputs):
        def run(args):
            return [_scale_half(o) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                    for o in g(*args)]

        run._boxed_call = True
        return run

    return aot_autograd(fw_compiler=forward, bw_compiler=backward)(gm, example_inputs)
