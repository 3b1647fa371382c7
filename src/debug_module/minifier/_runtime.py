# Standalone runtime of debug_module repros: torch and the standard library only.
#
# This file is copied verbatim into every generated repro.py (the repro must run where this project is
# not installed), and the minifier's in-process oracles use the same matching functions, so "the
# signature holds" means the same thing during reduction and in the repro.
import contextlib
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


def _strided_clone(x):
    """A copy of ``x`` with its shape and strides, also where elements share memory (an ``expand``'s
    stride 0, which ``copy_`` into such a tensor refuses): the span of storage it covers is cloned and
    viewed with the same strides."""
    x = x.detach()
    if x.numel() == 0:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    span = 1 + sum((d - 1) * st for d, st in zip(x.shape, x.stride()))
    with torch.no_grad():
        flat = x.as_strided((span,), (1,), x.storage_offset()).clone()
    return flat.as_strided(x.shape, x.stride(), 0)


def fresh(inputs):
    """Fresh clones of ``inputs`` (same strides, dtype and ``requires_grad``): every oracle run gets
    its own, so a graph that changes its inputs in place (``sin_``, ``copy_``) sees the original values."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            c = _strided_clone(x)
            if x.requires_grad and x.is_leaf:
                c.requires_grad_(True)
            x = c
        out.append(x)
    return out


def backend_copy(gm):
    """The copy of graph module ``gm`` a backend is given: its graph, nodes' arguments and parameters
    copied, so a backend that edits what it is given in place (retargets a node, rewrites its args,
    inserts nodes) never changes the graph the reference runs."""
    import copy

    return copy.deepcopy(gm)


_NARROWER_THAN_FLOAT64 = (torch.float32, torch.float16, torch.bfloat16)


class WidenToFloat64(TorchDispatchMode):
    """Keeps a float64 computation float64 where the code narrows it: a cast of a float64 tensor to a
    narrower float (``.float()``, ``.to(torch.float32)``, ``.to(h.dtype)`` baked into a graph, a
    softmax's or sum's ``dtype=``) stays float64, and a narrower float tensor meeting a float64 one
    (a constant made at float32) is widened. What ``float64_eager``'s ``NoNarrowing`` does for a model's
    code, at the ATen level, so it holds for FX and ATen graphs too. Casts of integer tensors to a
    float are left as written."""

    _KEEP = ("aten::view.dtype",)  # a bit reinterpretation, not a cast

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        wide = any(t.dtype == torch.float64 for t in tensors)
        if wide and str(func._schema.name) + "." + func._overloadname not in self._KEEP:
            first = tensors[0]
            if first.dtype == torch.float64:
                if kwargs.get("dtype") in _NARROWER_THAN_FLOAT64:
                    kwargs["dtype"] = torch.float64
                args = tuple(torch.float64 if isinstance(a, torch.dtype) and a in _NARROWER_THAN_FLOAT64 else a
                             for a in args)
            if not func._schema.is_mutable:
                args, kwargs = _widen_tensors((args, kwargs))
        return func(*args, **kwargs)


def _widen_tensors(tree):
    """``tree`` (nested tuples, lists, dicts) with every narrower-than-float64 float tensor in float64."""
    if isinstance(tree, torch.Tensor):
        return tree.to(torch.float64) if tree.dtype in _NARROWER_THAN_FLOAT64 else tree
    if isinstance(tree, (list, tuple)):
        return type(tree)(_widen_tensors(v) for v in tree)
    if isinstance(tree, dict):
        return {k: _widen_tensors(v) for k, v in tree.items()}
    return tree


COMPUTE_OPS = ("call_function", "call_method", "call_module")


def node_op(n):
    """A compute node's op as text (``torch.exp``, ``add``, a method's or submodule's name)."""
    t = n.target
    return t if isinstance(t, str) else "%s.%s" % (getattr(t, "__module__", ""), getattr(t, "__name__", repr(t)))


def restore_module_stacks(gm, stacks):
    """Give the compute nodes of ``gm`` (a graph traced from the repro's code) the ``nn_module_stack`` the
    original graph's nodes had (``stacks``: one ``{"op", "stack"}`` per compute node, in order); a node
    whose op differs from the recorded one at its position gets none. The class in each entry is its name."""
    nodes = [n for n in gm.graph.nodes if n.op in COMPUTE_OPS]
    for n, rec in zip(nodes, stacks or ()):
        if rec["stack"] and node_op(n) == rec["op"]:
            n.meta["nn_module_stack"] = {k: (v[0], v[1]) for k, v in rec["stack"].items()}


def run_quietly(model, args):
    """``model(*args)``; an FX graph module's generated ``forward`` is called directly, so a failure
    raises its exception without FX printing the generated code's traceback on stderr."""
    forward = model.forward if isinstance(model, torch.fx.GraphModule) else model
    return forward(*args)


def caches_off():
    """A context in which Inductor's FX graph cache and AOTAutograd's cache are off, so a compile is
    really done and detection does not depend on what an earlier process left on disk. (The repro's
    standalone copy of ``debug_framework._torch.inductor.compile_caches_off``.)"""
    import contextlib
    import importlib

    stack = contextlib.ExitStack()
    try:  # by name: this runtime runs in repros, where debug_framework._torch is not importable
        inductor_config = importlib.import_module("torch._inductor.config")
        functorch_config = importlib.import_module("torch._functorch.config")
    except ImportError:  # a torch without them: nothing to turn off
        return stack
    flags = {k: False for k in ("fx_graph_cache", "fx_graph_remote_cache") if hasattr(inductor_config, k)}
    stack.enter_context(inductor_config.patch(flags))
    if hasattr(functorch_config, "enable_autograd_cache"):
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def _nonfinite_mismatches(r64, a64):
    """Positions where ``alt`` is non-finite or ``ref`` is, and they differ: NaN matches NaN, an
    infinity only the same infinity (the comparison core's rule with ``equal_nan``)."""
    finite = torch.isfinite(r64) & torch.isfinite(a64)
    matched = (torch.isnan(r64) & torch.isnan(a64)) | (torch.isinf(r64) & (r64 == a64))
    return ~finite & ~matched


def _header_failure(r, a, base):
    """(failure, reason) for a shape or dtype mismatch, else (None, None). The dtype is judged
    against ``base``: the graph run eagerly at the inputs' precision (the reference itself in eager mode)."""
    if tuple(r.shape) != tuple(a.shape):
        return "shape", "shape mismatch: reference %s vs backend %s" % (list(r.shape), list(a.shape))
    if base is not None and base.dtype != a.dtype:
        return "dtype", "dtype mismatch: eager %s vs backend %s" % (_dtype_name(base.dtype), _dtype_name(a.dtype))
    return None, None


def compare_outputs(ref, alt, rtol, atol, base=None):
    """Per output: |alt - ref| <= atol + rtol*|ref| everywhere over the finite pairs, non-finite values
    where the reference has the same ones (NaN == NaN), the same shape, and the dtype of ``base`` (the
    eager run; default ``ref``). Each failing row names its ``failure``: shape, dtype, nonfinite or value."""
    refs, alts = _tensors(ref), _tensors(alt)
    bases = _tensors(base) if base is not None else refs
    rows = []
    if not len(refs) == len(alts) == len(bases):
        return [{"index": -1, "passed": False, "failure": "outputs",
                 "reason": "%d reference outputs, %d backend outputs" % (len(refs), len(alts))}]
    for i, (r, a, b) in enumerate(zip(refs, alts, bases)):
        failure, reason = _header_failure(r, a, b)
        if failure == "shape":
            rows.append({"index": i, "passed": False, "failure": failure, "reason": reason})
            continue
        r64, a64 = r.detach().to(torch.float64), a.detach().to(torch.float64)
        nonfinite = _nonfinite_mismatches(r64, a64)
        finite = torch.isfinite(r64) & torch.isfinite(a64)
        diff = torch.where(finite, (a64 - r64).abs(), torch.zeros_like(r64))
        bad_value = finite & ~(diff <= atol + rtol * r64.abs())
        max_abs = float(diff.max()) if diff.numel() else 0.0
        rel = diff / r64.abs().clamp_min(1e-30)
        max_rel = float(rel.max()) if rel.numel() else 0.0
        n_nf, n_val = int(nonfinite.sum()), int(bad_value.sum())
        if failure is None and n_nf:
            failure, reason = "nonfinite", "%d non-finite mismatch(es)" % n_nf
        elif failure is None and n_val:
            failure, reason = "value", "%d value(s) outside rtol=%g atol=%g" % (n_val, rtol, atol)
        rows.append({"index": i, "passed": failure is None, "failure": failure, "reason": reason,
                     "mismatched": n_nf + n_val, "nonfinite_mismatches": n_nf, "numel": r.numel(),
                     "max_abs_error": max_abs, "max_rel_error": max_rel})
    return rows


def _rmse_and_nonfinite(oracle, x):
    """RMSE of ``x`` against ``oracle`` over the pairs finite on both sides (None without one), and the
    number of non-finite values that mismatch (NaN matches NaN, an infinity only the same infinity)."""
    o, v = oracle.detach().to(torch.float64).reshape(-1), x.detach().to(torch.float64).reshape(-1)
    finite = torch.isfinite(o) & torch.isfinite(v)
    nonfinite_mismatch = int(_nonfinite_mismatches(o, v).sum())
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
    ``floor`` (+ ``floor_rms`` x the RMS of that output's oracle value), over finite pairs, with no
    more non-finite mismatches than the baseline, and the baseline's shape and dtype. The repro's
    standalone copy of ``debug_framework.comparison.RatioRule.verdict`` (metric ``rmse``) plus the
    dtype check; a test keeps the two in agreement. Failing rows name their ``failure`` as
    :func:`compare_outputs` does."""
    refs, bases, alts = _tensors(oracle), _tensors(base), _tensors(alt)
    if not len(refs) == len(bases) == len(alts):
        return [{"index": -1, "passed": False, "failure": "outputs", "reason": "%d oracle outputs, %d eager, %d backend"
                 % (len(refs), len(bases), len(alts))}]
    rows = []
    for i, (r, b, a) in enumerate(zip(refs, bases, alts)):
        if tuple(r.shape) != tuple(b.shape):
            rows.append({"index": i, "passed": False, "failure": "shape",
                         "reason": "shape %s vs %s" % (list(r.shape), list(b.shape))})
            continue
        failure, reason = _header_failure(r, a, b)
        if failure is not None:
            rows.append({"index": i, "passed": False, "failure": failure, "reason": reason})
            continue
        base_err, base_nf = _rmse_and_nonfinite(r, b)
        test_err, test_nf = _rmse_and_nonfinite(r, a)
        base_err = base_err or 0.0
        if test_err is None and test_nf == 0:
            test_err = 0.0  # nothing finite, every non-finite value where the oracle has it: an exact match
        floor_i = floor + floor_rms * _finite_rms(r) if floor_rms else floor
        bound = multiplier * base_err + floor_i
        if test_nf > base_nf:
            failure, reason = "nonfinite", "%d non-finite mismatch(es) against float64 (eager has %d)" % (test_nf, base_nf)
        elif test_err is None:
            failure, reason = "nonfinite", "no finite values to compare"
        elif not test_err <= bound:
            failure, reason = "value", "RMSE %.3e vs float64 exceeds %g x eager's RMSE %.3e + %g" % (
                test_err, multiplier, base_err, floor_i)
        rows.append({"index": i, "passed": failure is None, "failure": failure, "reason": reason,
                     "test_error": test_err, "eager_error": base_err, "bound": bound,
                     "nonfinite_mismatches": test_nf})
    return rows


def reference_inputs(inputs, reference):
    return [_to_float64(x) for x in inputs] if reference == "float64" else list(inputs)


def observe_accuracy(model, compile_fn, inputs, signature):
    """The accuracy observation of one graph: ``model`` run as the reference (on float64 inputs when
    ``signature["reference"]`` says so) and as the eager baseline, and ``compile_fn(inputs)`` (the
    backend's compiled callable) run once; every run on fresh clones of ``inputs``, every compile with
    the compile caches off. The minifier's in-process oracle and the generated repro both call this,
    so an output fails in one exactly when it fails in the other."""
    ratio = signature.get("ratio")
    float64 = signature["reference"] == "float64"
    run = "reference"
    try:
        with torch.no_grad():
            with WidenToFloat64() if float64 else contextlib.nullcontext():
                ref = run_quietly(model, reference_inputs(fresh(inputs), signature["reference"]))
            run = "eager baseline"
            base = run_quietly(model, fresh(inputs)) if float64 else None
            run = "backend"
            with caches_off():
                compiled = compile_fn(fresh(inputs))
                alt = compiled(*fresh(inputs))
    except Exception as e:  # noqa: BLE001 - a run that fails is a different bug
        which = "the %s run" % ("float64 reference" if float64 and run == "reference" else run)
        return {"kind": "accuracy", "error": ("%s failed: %s: %s" % (which, type(e).__name__, e))[:2000],
                "failed_run": run}
    if ratio:
        rows = ratio_outputs(ref, base, alt, ratio["multiplier"], ratio["floor"], ratio.get("floor_rms", 0.0))
    else:
        rows = compare_outputs(ref, alt, signature["rtol"], signature["atol"], base)
    return {"kind": "accuracy", "outputs": rows}


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
        wanted = sig.get("failures")  # the classes of the original failure (None: any)
        return any(not row["passed"] and (not wanted or row.get("failure") in wanted)
                   for row in obs.get("outputs", []))
    return False
