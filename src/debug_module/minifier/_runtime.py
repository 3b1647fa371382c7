# Standalone runtime of debug_module repros: torch and the standard library only.
#
# This file is copied verbatim into every generated repro.py (the repro must run where this project is
# not installed), and the minifier's in-process oracles use the same matching functions, so "the
# signature holds" means the same thing during reduction and in the repro.
import math
import operator
import re
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _dtype_name(d):
    return str(d).replace("torch.", "")


def _tensors(x):
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _check_tensor(c, op, t, is_view):
    """Violations of constraint ``c`` (a dict from Constraint.describe(), plus "kind") by one tensor."""
    kind = c["name"]
    out = []
    if kind == "dtype":
        if _dtype_name(t.dtype) not in c["allowed_dtypes"]:
            out.append(("dtype", "dtype %s is not supported" % _dtype_name(t.dtype)))
    elif kind == "shape_alignment":
        a = int(c["alignment"])
        if a > 1 and t.dim() > 0 and (c.get("check_views", True) or not is_view):
            dims = c["dims"]
            r = t.dim()
            idx = range(r) if dims == "all" else ([r - 1] if dims == "last" else sorted({d % r for d in dims if -r <= d < r}))
            bad = [i for i in idx if t.shape[i] % a]
            if bad:
                out.append(("shape_alignment", "dims %s of shape %s are not multiples of %d" % (bad, list(t.shape), a)))
    elif kind == "max_rank":
        if t.dim() > int(c["max_rank"]):
            out.append(("max_rank", "rank %d exceeds %d" % (t.dim(), c["max_rank"])))
    elif kind == "layout":
        if c.get("require_contiguous", True) and t.dim() > 1 and not t.is_contiguous() and (c.get("check_views") or not is_view):
            cl = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
            if not (c.get("allow_channels_last") and cl):
                out.append(("layout", "non-contiguous tensor (strides %s)" % (list(t.stride()),)))
    elif kind == "memory":
        limit = c.get("max_tensor_bytes")
        if limit is not None and not is_view and t.numel() * t.element_size() > limit:
            out.append(("memory_per_tensor", "tensor of %d bytes exceeds %d" % (t.numel() * t.element_size(), limit)))
    return out


def _check_op(c, op):
    kind = c["name"]
    packet = op.rsplit(".", 1)[0]
    if kind == "unsupported_op" and (op in c["ops"] or packet in c["ops"]):
        return [("unsupported_op", "op %s is not supported" % op)]
    if kind == "op_not_in_allowlist" and not (op in c["ops"] or packet in c["ops"]):
        return [("op_not_in_allowlist", "op %s is not among the accelerator's supported ops" % op)]
    return []


INLINE_CONSTRAINTS = ("dtype", "shape_alignment", "max_rank", "layout", "memory", "unsupported_op", "op_not_in_allowlist")


def liveness_peak(nodes, nbytes):
    """Peak live bytes of FX ``nodes`` run in order: each non-view op allocates its outputs
    (``nbytes(node)``); an allocation is freed after the last node that reads it or any view of it;
    graph outputs and inputs (placeholders, ``get_attr`` parameters, each counted once) are never
    freed. Multi-output ops allocate all outputs together (their ``getitem`` users alias them).
    Returns (peak bytes, input bytes, index of the node whose allocation reached the peak or None,
    [(node name, live bytes after it)])."""
    root, size, last_use, persistent, seen_params = {}, {}, {}, set(), set()
    input_bytes = 0
    for i, n in enumerate(nodes):
        if n.op in ("placeholder", "get_attr"):
            root[n] = n
            b = nbytes(n)
            if n.op == "get_attr" and str(n.target) in seen_params:
                b = 0
            seen_params.add(str(n.target))
            size[n] = b
            input_bytes += b
            persistent.add(n)
            continue
        if n.op == "output":
            for a in n.all_input_nodes:
                persistent.add(root.get(a, a))
            continue
        first_tensor_arg = next((a for a in n.all_input_nodes if a in root), None)
        if n.target is operator.getitem and first_tensor_arg is not None:
            root[n] = root[first_tensor_arg]
        elif getattr(n.target, "is_view", False) and first_tensor_arg is not None:
            root[n] = root[first_tensor_arg]
        else:
            root[n] = n
            size[n] = nbytes(n)
        for a in n.all_input_nodes:
            if a in root:
                last_use[root[a]] = i
    live = input_bytes
    peak, peak_index = live, None
    timeline = []
    frees = {}
    for r, i in last_use.items():
        frees.setdefault(i, []).append(r)
    for i, n in enumerate(nodes):
        if n.op in ("call_function", "call_method", "call_module") and root.get(n) is n:
            live += size[n]
            if live > peak:
                peak, peak_index = live, i
            if n not in last_use and n not in persistent:  # dead value: freed at once
                live -= size[n]
        for r in frees.get(i, ()):
            if r not in persistent and root.get(r) is r and r.op not in ("placeholder", "get_attr"):
                live -= size[r]
        timeline.append((n.name, live))
    return peak, input_bytes, peak_index, timeline


def _peak_memory_violations(model, inputs, constraints):
    """The ``memory_peak`` check of the mock accelerator, on the graph traced from ``model`` and run
    on ``inputs`` for the sizes (the same liveness estimate as debug_module.constraints)."""
    limits = [c["max_peak_bytes"] for c in constraints if c["name"] == "memory" and c.get("max_peak_bytes") is not None]
    if not limits:
        return []
    gm = torch.fx.symbolic_trace(model)
    sizes = {}

    class Sizes(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            sizes[n] = sum(t.numel() * t.element_size() for t in _tensors(out))
            return out

    with torch.no_grad():
        Sizes(gm).run(*inputs)
    nodes = list(gm.graph.nodes)
    peak, _, index, _ = liveness_peak(nodes, lambda n: sizes.get(n, 0))
    op = str(nodes[index].target) if index is not None else ""
    return [{"constraint": "memory_peak", "op": op,
             "message": "estimated peak live memory %d bytes exceeds %d" % (peak, limit)}
            for limit in limits if peak > limit]


class ConstraintCheckMode(TorchDispatchMode):
    """Checks every ATen op that runs (and the inputs) against mock-accelerator constraints."""

    def __init__(self, constraints):
        super().__init__()
        self.constraints = [c for c in constraints if c["name"] in INLINE_CONSTRAINTS]
        self.violations = []

    def check_inputs(self, inputs):
        for t in _tensors(inputs):
            for c in self.constraints:
                for name, msg in _check_tensor(c, "placeholder", t, False):
                    self.violations.append({"constraint": name, "op": "placeholder", "message": msg})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = str(func)
        is_view = bool(getattr(func, "is_view", False))
        for c in self.constraints:
            found = _check_op(c, op)
            for t in _tensors(out):
                found += _check_tensor(c, op, t, is_view)
            for name, msg in found:
                self.violations.append({"constraint": name, "op": op, "message": msg})
        return out


def observe_constraints(fn, inputs, constraints):
    mode = ConstraintCheckMode(constraints)
    mode.check_inputs(inputs)
    with torch.no_grad(), mode:
        fn(*inputs)
    return {"kind": "constraint", "violations": mode.violations + _peak_memory_violations(fn, inputs, constraints)}


def _exception_record(e):
    return {"type": type(e).__name__, "mro": [k.__name__ for k in type(e).__mro__],
            "message": str(e)[:4000], "traceback": "".join(traceback.format_exception(e))[-4000:]}


def observe_exception(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - recording any failure is the point
        return {"kind": "exception", "raised": True, **_exception_record(e)}
    return {"kind": "exception", "raised": False}


def _to_float64(x):
    if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        return x.detach().to(torch.float64)
    return x


def compare_outputs(ref, alt, rtol, atol):
    """Per output: shape, max abs/rel error, and whether |alt-ref| <= atol + rtol*|ref| everywhere (NaN == NaN)."""
    refs, alts = _tensors(ref), _tensors(alt)
    rows = []
    if len(refs) != len(alts):
        return [{"index": -1, "passed": False, "reason": "%d reference outputs, %d backend outputs" % (len(refs), len(alts))}]
    for i, (r, a) in enumerate(zip(refs, alts)):
        if tuple(r.shape) != tuple(a.shape):
            rows.append({"index": i, "passed": False, "reason": "shape %s vs %s" % (list(r.shape), list(a.shape))})
            continue
        r64, a64 = r.detach().to(torch.float64), a.detach().to(torch.float64)
        both_nan = torch.isnan(r64) & torch.isnan(a64)
        diff = (a64 - r64).abs()
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        bad = ~(diff <= atol + rtol * r64.abs())
        max_abs = float(diff.max()) if diff.numel() else 0.0
        rel = diff / r64.abs().clamp_min(1e-30)
        max_rel = float(rel.max()) if rel.numel() else 0.0
        rows.append({"index": i, "passed": not bool(bad.any()), "mismatched": int(bad.sum()), "numel": r.numel(),
                     "max_abs_error": None if math.isnan(max_abs) else max_abs,
                     "max_rel_error": None if math.isnan(max_rel) else max_rel})
    return rows


def _rmse_and_nonfinite(oracle, x):
    """RMSE of ``x`` against ``oracle`` over the pairs finite on both sides (None without one), and the
    number of non-finite values that mismatch (NaN matches NaN, an infinity only the same infinity)."""
    o, v = oracle.detach().to(torch.float64).reshape(-1), x.detach().to(torch.float64).reshape(-1)
    finite = torch.isfinite(o) & torch.isfinite(v)
    matched = (torch.isnan(o) & torch.isnan(v)) | (torch.isinf(o) & (o == v))
    nonfinite_mismatch = int((~finite & ~matched).sum())
    if not int(finite.sum()):
        return (None if o.numel() else 0.0), nonfinite_mismatch
    return float(((v[finite] - o[finite]) ** 2).mean().sqrt()), nonfinite_mismatch


def _finite_rms(x):
    """RMS of the finite values of ``x`` in float64 (0.0 without one): ``finite_rms``'s standalone copy."""
    a = x.detach().to(torch.float64).reshape(-1)
    a = a[torch.isfinite(a)].abs()
    peak = float(a.max()) if a.numel() else 0.0
    return 0.0 if peak == 0.0 else peak * float(((a / peak) ** 2).mean().sqrt())


def ratio_outputs(oracle, base, alt, multiplier, floor, floor_rms=0.0):
    """Per output, the ratio rule against the float64 ``oracle`` with ``base`` (eager at the inputs'
    precision) as the baseline: the backend's RMSE may be at most ``multiplier`` x the baseline's +
    ``floor`` (+ ``floor_rms`` x the RMS of that output's oracle value), over finite pairs, with no more non-finite mismatches than the baseline. The repro's
    standalone copy of ``debug_framework.comparison.RatioRule.verdict`` (metric ``rmse``); a test
    keeps the two in agreement."""
    refs, bases, alts = _tensors(oracle), _tensors(base), _tensors(alt)
    if not len(refs) == len(bases) == len(alts):
        return [{"index": -1, "passed": False, "reason": "%d oracle outputs, %d eager, %d backend"
                 % (len(refs), len(bases), len(alts))}]
    rows = []
    for i, (r, b, a) in enumerate(zip(refs, bases, alts)):
        if tuple(r.shape) != tuple(a.shape) or tuple(r.shape) != tuple(b.shape):
            rows.append({"index": i, "passed": False, "reason": "shape %s vs %s" % (list(r.shape), list(a.shape))})
            continue
        base_err, base_nf = _rmse_and_nonfinite(r, b)
        test_err, test_nf = _rmse_and_nonfinite(r, a)
        base_err = base_err or 0.0
        floor_i = floor + floor_rms * _finite_rms(r) if floor_rms else floor
        bound = multiplier * base_err + floor_i
        if test_nf > base_nf:
            passed, reason = False, "%d non-finite mismatch(es) against float64 (eager has %d)" % (test_nf, base_nf)
        elif test_err is None:
            passed, reason = False, "no finite values to compare"
        else:
            passed = test_err <= bound
            reason = None if passed else "RMSE %.3e vs float64 exceeds %g x eager's RMSE %.3e + %g" % (
                test_err, multiplier, base_err, floor_i)
        rows.append({"index": i, "passed": passed, "reason": reason, "test_error": test_err,
                     "eager_error": base_err, "bound": bound})
    return rows


def reference_inputs(inputs, reference):
    return [_to_float64(x) for x in inputs] if reference == "float64" else list(inputs)


# --------------------------------------------------------------------------- matching


def matches(sig, obs):
    """Whether an observation shows the signature (both JSON-ready dicts)."""
    if obs is None or obs.get("kind") != sig["kind"]:
        return False
    if sig["kind"] == "constraint":
        for v in obs["violations"]:
            if v["constraint"] != sig["constraint"]:
                continue
            if sig.get("op") and v["op"] != sig["op"] and v["op"].rsplit(".", 1)[0] != sig["op"]:
                continue
            if sig.get("message") and not re.search(sig["message"], v.get("message", "")):
                continue
            return True
        return False
    if sig["kind"] == "exception":
        if not obs.get("raised"):
            return False
        if sig["type"] not in obs.get("mro", [obs.get("type")]):
            return False
        return re.search(sig.get("pattern") or "", obs.get("message", ""), re.S) is not None
    if sig["kind"] == "accuracy":
        if obs.get("error"):
            return False
        return any(not row["passed"] for row in obs.get("outputs", []))
    return False
