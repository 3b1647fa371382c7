"""A torch.compile backend with wrong lowerings for exactly three ATen operators (the conformance
sweep's done-when test): gelu computed with the tanh approximation, softmax summed in float16, and
cumsum shifted by one (an exclusive scan). Everything else runs as AOTAutograd traced it.

Used as ``debug_opsweep --backend-file examples/conformance/wrong_lowerings.py`` (docs/conformance.md).
"""

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

aten = torch.ops.aten


def _gelu_tanh(x, approximate="none"):
    return aten.gelu.default(x, approximate="tanh")


def _softmax_f16_sum(x, dim, half_to_float):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    s = e.to(torch.float16).sum(dim, keepdim=True).to(e.dtype)
    out = e / s
    return out.to(torch.float32) if half_to_float else out


def _cumsum_shifted(x, dim, dtype=None):
    c = aten.cumsum.default(x, dim, dtype=dtype)
    return c - x.to(c.dtype)


_WRONG = {aten.gelu.default: _gelu_tanh, aten._softmax.default: _softmax_f16_sum,
          aten.cumsum.default: _cumsum_shifted}


def _rewrite(gm, example_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _WRONG:
            node.target = _WRONG[node.target]
    gm.recompile()
    return make_boxed_func(gm.forward)


backend = aot_autograd(fw_compiler=_rewrite)
